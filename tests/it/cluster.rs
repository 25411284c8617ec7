//! Many instances over one Kafka cluster (SPEC, "Many instances"): membership by heartbeats
//! through an evmesh-owned Kafka topic, seen at `GET /admin/cluster`. The Kafka tests need the
//! broker `scripts/test.sh` starts (EVMESH_TEST_KAFKA).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::delivery::{next_event, Ws};
use super::util::{event, wait_for, TestBroker};

/// The ids of the live instances `b` sees (sorted), and how many of them it calls itself.
fn live(b: &TestBroker) -> (Vec<String>, usize) {
    let v = b.admin().get("/admin/cluster").json();
    let all = v["instances"].as_array().cloned().unwrap_or_default();
    let ids = all.iter().map(|i| i["instanceId"].as_str().unwrap().to_owned()).collect();
    (ids, all.iter().filter(|i| i["self"] == true).count())
}

fn instance_id(b: &TestBroker) -> String {
    b.admin().get("/admin/cluster").json()["instanceId"].as_str().unwrap().to_owned()
}

/// On the embedded log the cluster is this instance alone; its id is made once and kept in
/// data_dir (a restart is the same instance), or named with `--instance-id`. The broker's own
/// Kafka topic names (`__evmesh.`) are no client's.
#[test]
fn an_embedded_instance_is_a_cluster_of_one_with_a_kept_id() {
    let mut b = TestBroker::start(&["--heartbeat-ms", "50"]);
    let v = wait_for(Duration::from_secs(10), || {
        let v = b.admin().get("/admin/cluster").json();
        (v["instances"].as_array().is_some_and(|a| a.len() == 1)).then_some(v)
    });
    assert_eq!((&v["storage"], &v["claimsRead"]), (&Value::from("embedded"), &Value::Bool(true)));
    let me = &v["instances"][0];
    assert_eq!((&me["instanceId"], &me["self"]), (&v["instanceId"], &Value::Bool(true)), "{v}");
    assert_eq!(me["advertisedUrl"], format!("http://{}", b.traffic));
    let id = instance_id(&b);
    b.restart();
    assert_eq!(instance_id(&b), id, "kept in data_dir");
    let named = TestBroker::start(&["--instance-id", "eu-1.a"]);
    assert_eq!(instance_id(&named), "eu-1.a");
    b.publish("__evmesh.instances", &event("e")).assert_problem(400);
    // Every recommendation is this instance; a subscription's answer says so too.
    let url = format!("http://{}", b.traffic);
    for q in ["subscription=s", "clientId=c", "sessionId=bot:0000", "sessionId=notes-1"] {
        assert_eq!(recommend(&b, q), Some(url.clone()), "{q}");
    }
    let r = b.client().post("/events/subscribe", "application/json", br#"{"subscription":"s","topic":"t"}"#);
    assert_eq!(r.json()["instanceUrl"], url, "{}", r.text());
    b.client().get("/session/recommend").assert_problem(400);
    b.client().get("/session/recommend?subscription=s&clientId=c").assert_problem(400);
    b.client().get("/session/recommend?sessionId=bad%20id").assert_problem(400);
}

/// `GET /session/recommend?{q}` at `b`: the instance URL, or `None` when it cannot say yet.
fn recommend(b: &TestBroker, q: &str) -> Option<String> {
    let r = b.client().get(&format!("/session/recommend?{q}"));
    match r.status {
        200 => Some(r.json()["instanceUrl"].as_str().unwrap().to_owned()),
        503 => None,
        s => panic!("{s}: {}", r.text()),
    }
}

#[cfg(feature = "kafka")]
mod on_kafka {
    use super::*;

    /// Three instances over one Kafka cluster (one topic prefix) see each other; one killed
    /// leaves every view within its timeout; restarted on its data dir, it is the same
    /// instance again.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn instances_see_each_other_and_a_killed_one_leaves_every_view() {
        let (brokers, prefix) = kafka_and_prefix("cl");
        let start = || start_in(&brokers, &prefix);
        let (a, b, mut c) = (start(), start(), start());
        let ids: Vec<String> = [&a, &b, &c].iter().map(|x| instance_id(x)).collect();
        let mut want = ids.clone();
        want.sort();
        want.dedup();
        assert_eq!(want.len(), 3, "{ids:?}");
        for x in [&a, &b, &c] {
            wait_for(Duration::from_secs(20), || (live(x) == (want.clone(), 1)).then_some(()));
        }
        // Each says where clients reach it, and its load.
        let v = a.admin().get("/admin/cluster").json();
        for (x, id) in [&a, &b, &c].iter().zip(&ids) {
            let i = v["instances"].as_array().unwrap().iter().find(|i| i["instanceId"] == **id).unwrap();
            assert_eq!(i["advertisedUrl"], format!("http://{}", x.traffic), "{v}");
            assert!(i["sessions"].is_u64() && i["cpuPercent"].is_number(), "{v}");
            assert!(i["lastHeartbeatMs"].as_u64().unwrap() < 1000, "{v}");
        }
        // Killed: gone from the others' views once silent for the timeout (1 s; the bound
        // checked is loose, for a loaded machine), and not before it went silent.
        c.kill9();
        let killed = Instant::now();
        let without: Vec<String> = want.iter().filter(|id| **id != ids[2]).cloned().collect();
        for x in [&a, &b] {
            wait_for(Duration::from_secs(10), || (live(x).0 == without).then_some(()));
        }
        assert!(killed.elapsed() >= Duration::from_millis(500), "dropped before its timeout: {:?}", killed.elapsed());
        c.restart();
        assert_eq!(instance_id(&c), ids[2], "the same instance again");
        for x in [&a, &b, &c] {
            wait_for(Duration::from_secs(20), || (live(x) == (want.clone(), 1)).then_some(()));
        }
    }

    /// A classic TCP client subscribing at an instance that is not the home of its group's
    /// subscription is answered code 1 (307) and REDIRECT_TO_CLIENT to the home's host (on this
    /// instance's TCP port: instances of one cluster listen on the same one), then closed; at
    /// the home it subscribes.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_classic_tcp_subscriber_away_from_its_home_is_redirected() {
        let (brokers, prefix) = kafka_and_prefix("tcpr");
        let extra = ["--tcp-listen", "127.0.0.1:0"];
        let all = [start_in_with(&brokers, &prefix, &extra), start_in_with(&brokers, &prefix, &extra)];
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 2).then_some(()));
        let def = r#"{"subscription":"cg.4.shop.orders","topic":"orders","mode":"LOAD_BALANCE"}"#;
        assert_eq!(all[0].client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
        let home = wait_for(Duration::from_secs(20), || recommend(&all[0], "subscription=cg.4.shop.orders"));
        let (at_home, away) = if url(&all[0]) == home { (&all[0], &all[1]) } else { (&all[1], &all[0]) };
        // A client written from the Java codec (`eventmesh_tcp::Tcp`).
        let subscribe = |at: &TestBroker| {
            let mut c = super::super::eventmesh_tcp::Tcp::connect(at);
            assert_eq!(c.hello("shop", "sub", "")["code"], 0);
            let answer = c.subscribe("orders", "CLUSTERING", "ASYNC");
            (c, answer)
        };
        let (mut c, answer) = subscribe(away);
        assert_eq!(answer["code"], 1, "{answer}");
        assert!(answer["desc"].as_str().unwrap().starts_with("307"), "{answer}");
        let (h, body) = c.read().expect("REDIRECT_TO_CLIENT");
        assert_eq!(h["cmd"], "REDIRECT_TO_CLIENT");
        let to: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(to, serde_json::json!({"ip": "127.0.0.1", "port": away.tcp.unwrap().port()}));
        assert!(c.read().is_none(), "closed after the redirect");
        let (_c, answer) = subscribe(at_home);
        assert_eq!(answer["code"], 0, "{answer}");
    }

    /// One trace across two instances: the publish recorded by the instance that stored it,
    /// the delivery and its ack by the subscription's home, which read the event (and its
    /// context, a record header) back from Kafka.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA and Python with opentelemetry-proto (scripts/test.sh starts and installs them)"]
    fn one_trace_spans_the_instance_that_stored_and_the_one_that_delivered() {
        use super::super::tracing::{Collector, TP};
        let collector = Collector::start("kafka");
        let (brokers, prefix) = kafka_and_prefix("tr");
        let endpoint = collector.url();
        let extra = ["--otlp-endpoint", endpoint.as_str()];
        let all = [start_in_with(&brokers, &prefix, &extra), start_in_with(&brokers, &prefix, &extra)];
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 2).then_some(()));
        let def = r#"{"subscription":"traced","topic":"tt","mode":"LOAD_BALANCE","start":"earliest"}"#;
        assert_eq!(all[0].client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
        let (mut ws, home) = attach_following(&all[0], "subscription=traced");
        let (at_home, away) = if url(&all[0]) == home { (&all[0], &all[1]) } else { (&all[1], &all[0]) };
        let h = [("content-type", "application/cloudevents+json"), ("traceparent", TP)];
        let r = away.client().request("POST", "/events/publish?topic=tt", &h, event("k1").to_string().as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
        let e = take(&mut ws, 1).remove(0);
        assert_eq!(e["traceparent"], TP);
        super::super::acked::ack(&mut ws, &[&e]);
        let trace = &TP[3..35];
        let publish = collector.span(trace, "publish tt");
        let deliver = collector.span(trace, "deliver traced");
        let ack = collector.span(trace, "ack traced");
        assert_eq!(publish["instance"], instance_id(away), "stored where it was published");
        assert_eq!(deliver["instance"], instance_id(at_home), "delivered by the home");
        assert_eq!((publish["parent"].as_str(), deliver["parent"].as_str()), (Some(&TP[36..52]), Some(&TP[36..52])));
        assert_eq!(ack["parent"], deliver["span_id"]);
    }

    fn start_in(brokers: &str, prefix: &str) -> TestBroker {
        start_in_with(brokers, prefix, &[])
    }

    fn start_in_with(brokers: &str, prefix: &str, extra: &[&str]) -> TestBroker {
        let mut args = vec![
            "--storage",
            "kafka",
            "--kafka-brokers",
            brokers,
            "--kafka-topic-prefix",
            prefix,
            "--heartbeat-ms",
            "100",
            "--instance-timeout-ms",
            "1000",
        ];
        args.extend_from_slice(extra);
        TestBroker::start(&args)
    }

    fn url(b: &TestBroker) -> String {
        format!("http://{}", b.traffic)
    }

    /// A WebSocket session asked of `b`, following a 307 to the home as a client would.
    fn attach_following(b: &TestBroker, query: &str) -> (Ws, String) {
        ws_following(b, &format!("/events/ws?{query}"))
    }

    /// A WebSocket upgrade of `path` asked of `b`, following 307s: (the socket, where it is).
    fn ws_following(b: &TestBroker, path: &str) -> (Ws, String) {
        let mut at = format!("{}{path}", url(b));
        for _ in 0..3 {
            let host = at.strip_prefix("http://").unwrap().split('/').next().unwrap().to_owned();
            let stream = std::net::TcpStream::connect(&host).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            match tungstenite::client(at.replacen("http://", "ws://", 1), stream) {
                Ok((ws, _)) => {
                    ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                    return (ws, format!("http://{host}"));
                }
                Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) if r.status() == 307 => {
                    at = r.headers()["location"].to_str().unwrap().to_owned();
                }
                Err(e) => panic!("attaching at {at}: {e}"),
            }
        }
        panic!("redirected more than three times")
    }

    /// `POST path` with a JSON body asked of `b`, following 307s as a client would (the body sent
    /// again): (the instance that answered, its answer).
    fn post_following(b: &TestBroker, path: &str, body: &Value) -> (String, super::super::util::Resp) {
        let content_type = match path.starts_with("/session/publish/") || path.starts_with("/events/publish") {
            true => "application/cloudevents+json",
            false => "application/json",
        };
        let (mut host, mut target) = (b.traffic.to_string(), path.to_owned());
        for _ in 0..3 {
            let mut c = super::super::util::Client::connect(host.parse().unwrap());
            let r = c.post(&target, content_type, body.to_string().as_bytes());
            if r.status != 307 {
                return (format!("http://{host}"), r);
            }
            let location = r.header("location").unwrap().strip_prefix("http://").unwrap().to_owned();
            let (h, t) = location.split_at(location.find('/').unwrap());
            (host, target) = (h.to_owned(), t.to_owned());
        }
        panic!("redirected more than three times")
    }

    /// Agents, their streaming sessions and session pub/sub have homes too. An agent registers
    /// and attaches at its home (307 from any other instance, followed), which its
    /// registration claims; `POST /session/open` asked anywhere answers that home's URL, where
    /// the session's turns are served (307 elsewhere) and reach the agent. A session pub/sub
    /// topic is served at the home its first publish claimed. The agent's home paused past the
    /// timeout, the agent registers again at another instance; resumed, the old home finds its
    /// claim taken, closes the agent's WebSocket (1012) and sends its callers on.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn agents_sessions_and_session_topics_are_served_at_their_home() {
        use super::super::calls::Turn;
        use super::super::delivery::read_until_closed;
        use serde_json::json;
        let (brokers, prefix) = kafka_and_prefix("ag");
        let all: Vec<TestBroker> = (0..3).map(|_| start_in(&brokers, &prefix)).collect();
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 3).then_some(()));
        let by_url = |u: &str| all.iter().find(|b| url(b) == u).unwrap();
        let refs: Vec<&TestBroker> = all.iter().collect();
        // Registered wherever it asks, the agent ends at its home; every instance agrees.
        let (home_url, r) = post_following(&all[0], "/agent/register", &json!({"agentId": "echo"}));
        assert_eq!(r.status, 201, "{}", r.text());
        says(&refs, "sessionId=echo:00", &home_url);
        let home = by_url(&home_url);
        let elsewhere: Vec<&TestBroker> = all.iter().filter(|b| url(b) != home_url).collect();
        let (mut agent, at) = ws_following(elsewhere[0], "/agent/ws?agentId=echo");
        assert_eq!(at, home_url);
        super::super::calls::attached(home, "echo", None);
        // A session opened anywhere is opened at the agent's home (the instance asked opens it
        // there for the caller: no redirect to follow), and the answer says where.
        let open = |b: &TestBroker, body: &Value| {
            b.client().post("/session/open", "application/json", body.to_string().as_bytes())
        };
        let r = open(elsewhere[1], &json!({"clientId": "c1", "agentId": "echo"}));
        assert_eq!((r.status, &r.json()["instanceUrl"]), (201, &Value::from(home_url.clone())), "{}", r.text());
        let sid = r.json()["sessionId"].as_str().unwrap().to_owned();
        // Another instance learns the session's claim from Kafka: it says the home once read.
        says(&[elsewhere[0]], &format!("sessionId={sid}"), &home_url);
        // Its turns are served there only.
        for b in &elsewhere {
            let refused = Turn::post(b, &sid, "hello").err().expect("not served here");
            assert_eq!(refused.0, 307, "{}", refused.1);
        }
        let mut turn = Turn::post(home, &sid, "hello").unwrap();
        let request = wait_for(Duration::from_secs(10), || next_event(&mut agent));
        assert_eq!((request["emsessionid"].as_str(), request["data"].as_str()), (Some(sid.as_str()), Some("hello")));
        let chunk = json!({"type": "chunk", "sessionId": sid, "seq": 0, "data": "hi", "done": true});
        agent.send(tungstenite::Message::text(chunk.to_string())).unwrap();
        assert_eq!(turn.next(), Some((Some("0".into()), "done".into(), "hi".into())));
        // `evmesh agent` asked of an instance that is not the agent's home follows it there
        // (its home made known first by a registration over HTTP).
        let (cli_home, r) = post_following(&all[0], "/agent/register", &json!({"agentId": "cli-echo"}));
        assert_eq!(r.status, 201, "{}", r.text());
        says(&refs, "sessionId=cli-echo:00", &cli_home);
        let asked = all.iter().find(|b| url(b) != cli_home).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"))
            .args(["agent", "--url", &url(asked), "--agent-id", "cli-echo", "--max-turns", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let open_cli = json!({"clientId": "c2", "agentId": "cli-echo"});
        let mut turn = wait_for(Duration::from_secs(10), || {
            let r = open(asked, &open_cli);
            let sid = (r.status == 201).then(|| r.json()["sessionId"].as_str().unwrap().to_owned())?;
            Turn::post(by_url(r.json()["instanceUrl"].as_str().unwrap()), &sid, "hello cli").ok()
        });
        let done = std::iter::from_fn(|| turn.next()).last();
        assert_eq!(done, Some((Some("2".into()), "done".into(), String::new())));
        assert!(child.wait().unwrap().success(), "--max-turns 1: it stops after the turn");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(err.contains(&format!("attached at {cli_home}/agent/ws")), "{err}");
        // Session pub/sub: the first publish claims the session's home; it is served there.
        let ev = event("note");
        let (topic_home, r) = post_following(&all[0], "/session/publish/notes-1", &ev);
        assert_eq!(r.status, 201, "{}", r.text());
        says(&refs, "sessionId=notes-1", &topic_home);
        let (mut follower, at) = ws_following(&all[2], "/session/subscribe/notes-1");
        assert_eq!(at, topic_home);
        assert_eq!(wait_for(Duration::from_secs(10), || next_event(&mut follower))["id"], "note");
        // Published as a topic, through any instance (an L4 balancer), it is sent there too.
        let other = all.iter().find(|b| url(b) != topic_home).unwrap();
        let r = other.publish("session.notes-1", &event("note-2"));
        assert_eq!(r.status, 307, "{}", r.text());
        let (at, r) = post_following(other, "/events/publish?topic=session.notes-1", &event("note-2"));
        assert_eq!((r.status, at.as_str()), (202, topic_home.as_str()), "{}", r.text());
        assert_eq!(wait_for(Duration::from_secs(10), || next_event(&mut follower))["id"], "note-2");
        // A subscriber another instance sent on to one that is not the home (views a moment
        // apart) is served there until the home's claim is read: then it is closed (1012).
        let choice = agreed(&refs, "sessionId=notes-2");
        let stray = all.iter().find(|b| url(b) != choice).unwrap();
        let (mut lost, at) = ws_following(stray, "/session/subscribe/notes-2?evmeshRedirected=1");
        assert_eq!(at, url(stray), "served where it was sent");
        let (stored_at, r) = post_following(&all[0], "/session/publish/notes-2", &ev);
        assert_eq!(r.status, 201, "{}", r.text());
        // (The choice follows the instances' loads: it could have become the stray one.)
        if stored_at != url(stray) {
            let (code, _) = read_until_closed(&mut lost, Duration::from_secs(30));
            assert_eq!(code.map(u16::from), Some(1012));
        }
        // The agent's home paused past the timeout: the agent registers at another instance.
        let signal = |sig: &str| {
            let ok = std::process::Command::new("kill").args([sig, &home.pid().to_string()]).status().unwrap();
            assert!(ok.success());
        };
        signal("-STOP");
        let resume = scopeguard(|| signal("-CONT"));
        let new_home = wait_for(Duration::from_secs(30), || {
            let (x, y) = (recommend(elsewhere[0], "sessionId=echo:00"), recommend(elsewhere[1], "sessionId=echo:00"));
            (x == y).then_some(x).flatten().filter(|u| *u != home_url)
        });
        let (at, r) = post_following(elsewhere[0], "/agent/register", &json!({"agentId": "echo"}));
        assert_eq!((r.status, at.as_str()), (201, new_home.as_str()), "{}", r.text());
        drop(resume);
        // Resumed, the old home reads the claim that replaced its own: the agent's WebSocket
        // there is closed, and what names the agent is sent to the new home.
        let (code, _) = read_until_closed(&mut agent, Duration::from_secs(30));
        assert_eq!(code.map(u16::from), Some(1012));
        // (Once it hears the new home again: resumed, it may read the claim first.)
        wait_for(Duration::from_secs(10), || {
            let r = home.client().post("/agent/heartbeat", "application/json", br#"{"agentId":"echo"}"#);
            (r.status == 307 && r.header("location").is_some_and(|l| l.starts_with(&new_home))).then_some(())
        });
        let r = open(home, &json!({"clientId": "c1", "agentId": "echo"}));
        assert_eq!((r.status, &r.json()["instanceUrl"]), (201, &Value::from(new_home.clone())), "{}", r.text());
        // One sent on already is not opened elsewhere again: sent there.
        let r = home.client().post(
            "/session/open?evmeshRedirected=1",
            "application/json",
            br#"{"clientId":"c","agentId":"echo"}"#,
        );
        assert_eq!((r.status, r.header("location").map(|l| l.starts_with(&new_home))), (307, Some(true)));
    }

    /// Events read from `ws` until `n` arrived (failing after a while).
    fn take(ws: &mut Ws, n: usize) -> Vec<Value> {
        (0..n).map(|_| wait_for(Duration::from_secs(30), || next_event(ws))).collect()
    }

    /// `(partition, offset, attempt)` of a delivered event.
    fn delivered(e: &Value) -> (u64, u64, u64) {
        let id = e["emdeliveryid"].as_str().unwrap();
        let v: Vec<u64> = id.split(':').map(|x| x.parse().unwrap()).collect();
        (v[0], v[1], v[2])
    }

    /// The committed offset per partition of a subscription's own (LOAD_BALANCE) offsets, as
    /// instance `b` has it stored.
    fn committed(b: &TestBroker, subscription: &str) -> Vec<Option<u64>> {
        let v = b.admin().get("/admin/subscriptions").json();
        let s = v.as_array().unwrap().iter().find(|s| s["subscription"] == subscription).cloned();
        let parts = s.map(|s| s["partitions"].as_array().cloned().unwrap_or_default()).unwrap_or_default();
        parts
            .iter()
            .map(|p| p["consumers"].as_array().and_then(|c| c.first()).map(|c| c["committed"].as_u64().unwrap()))
            .collect()
    }

    /// Three instances, publishers spread over them as behind an L4 load balancer:
    /// LOAD_BALANCE sessions (wherever they were asked for, they end at the home) get each
    /// event once per ack; BROADCAST clients get every event; the home killed with events in
    /// flight, another instance takes the subscription over from the offsets and attempt
    /// counts the old home wrote to Kafka: exactly the unacknowledged events again, each with
    /// its next attempt, nothing acknowledged, nothing lost.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_killed_home_is_taken_over_from_the_offsets_it_wrote_to_kafka() {
        use std::collections::{BTreeMap, BTreeSet};
        let (brokers, prefix) = kafka_and_prefix("to");
        let parts = ["--default-partitions", "2"];
        let mut all: Vec<TestBroker> = (0..3).map(|_| start_in_with(&brokers, &prefix, &parts)).collect();
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 3).then_some(()));
        for (name, mode) in [("work", "LOAD_BALANCE"), ("fan", "BROADCAST")] {
            let def = format!(r#"{{"subscription":"{name}","topic":"jobs","mode":"{mode}","start":"earliest"}}"#);
            let r = all[0].client().post("/events/subscribe", "application/json", def.as_bytes());
            assert_eq!(r.status, 201, "{}", r.text());
        }
        wait_for(Duration::from_secs(20), || all.iter().all(|b| committed(b, "fan").len() == 2).then_some(()));
        // Sessions asked of two different instances: both end at the home.
        let (mut s1, home) = attach_following(&all[1], "subscription=work");
        let (mut s2, home2) = attach_following(&all[2], "subscription=work");
        assert_eq!(home, home2);
        let (mut c1, _) = attach_following(&all[0], "subscription=fan&clientId=c1");
        let (mut c2, _) = attach_following(&all[1], "subscription=fan&clientId=c2");
        let publish = |i: usize| {
            let r = all[i % 3].publish("jobs", &event(&format!("e{i}")));
            assert_eq!(r.status, 202, "{}", r.text());
        };
        for i in 0..60 {
            publish(i);
        }
        // Each event once per ack over the two sessions; every one to each BROADCAST client.
        let mut got = BTreeMap::new();
        while got.values().sum::<usize>() < 60 {
            for s in [&mut s1, &mut s2] {
                if let Some(e) = next_event(s) {
                    *got.entry(e["id"].as_str().unwrap().to_owned()).or_insert(0) += 1;
                    super::super::acked::ack(s, &[&e]);
                }
            }
        }
        assert!(got.len() == 60 && got.values().all(|&n| n == 1), "{got:?}");
        for c in [&mut c1, &mut c2] {
            let mut ids = BTreeSet::new();
            while ids.len() < 60 {
                let e = take(c, 1).remove(0);
                super::super::acked::ack(c, &[&e]);
                assert!(ids.insert(e["id"].as_str().unwrap().to_owned()), "twice: {e}");
            }
        }
        // Twenty more: per partition the earlier half acked, the rest left in flight.
        for i in 60..80 {
            publish(i);
        }
        let mut fresh = Vec::new();
        while fresh.len() < 20 {
            for (k, s) in [&mut s1, &mut s2].into_iter().enumerate() {
                if let Some(e) = next_event(s) {
                    fresh.push((e, k));
                }
            }
        }
        let mut by_part: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
        for (e, _) in &fresh {
            by_part.entry(delivered(e).0).or_default().push(e.clone());
        }
        let mut in_flight = BTreeSet::new();
        let mut want_committed = vec![None; 2];
        for (p, mut es) in by_part {
            es.sort_by_key(|e| delivered(e).1);
            let half = es.len() / 2;
            for e in &es[..half] {
                let s = if fresh.iter().any(|(f, k)| f == e && *k == 0) { &mut s1 } else { &mut s2 };
                super::super::acked::ack(s, &[e]);
            }
            want_committed[p as usize] = Some(delivered(&es[half]).1);
            in_flight.extend(es[half..].iter().map(|e| e["id"].as_str().unwrap().to_owned()));
        }
        // The home's offsets reach the other instances through Kafka.
        let home_at = all.iter().position(|b| url(b) == home).unwrap();
        for b in &all {
            wait_for(Duration::from_secs(20), || (committed(b, "work") == want_committed).then_some(()));
        }
        all[home_at].kill9();
        let killed = Instant::now();
        let rest: Vec<&TestBroker> = all.iter().enumerate().filter(|(i, _)| *i != home_at).map(|(_, b)| b).collect();
        // (Each instance sees the home die by its own clock: one may still send clients there.)
        let new_home = wait_for(Duration::from_secs(30), || {
            let (x, y) = (recommend(rest[0], "subscription=work"), recommend(rest[1], "subscription=work"));
            (x == y).then_some(x).flatten().filter(|u| *u != home)
        });
        let (mut s3, at) = attach_following(rest[1], "subscription=work");
        assert_eq!(at, new_home);
        let again = take(&mut s3, in_flight.len());
        eprintln!("first delivery by the new home {:?} after the kill", killed.elapsed());
        let ids: BTreeSet<String> = again.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(ids, in_flight, "exactly what was in flight");
        assert!(again.iter().all(|e| e["emattempt"] == 2), "attempts carried over: {again:?}");
        super::super::acked::ack(&mut s3, &again.iter().collect::<Vec<_>>());
        // Nothing acknowledged comes back; what is published now is delivered once.
        for (i, b) in rest.iter().enumerate() {
            assert_eq!(b.publish("jobs", &event(&format!("after{i}"))).status, 202);
        }
        let after: BTreeSet<String> = take(&mut s3, 2).iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(after, BTreeSet::from(["after0".to_owned(), "after1".to_owned()]));
        super::super::acked::quiet(&mut s3, Duration::from_millis(500));
        drop(all.remove(home_at));
    }

    /// A home paused past the timeout (a network partition, as others see it) is replaced;
    /// resumed, it finds its claim taken, closes its sessions of the subscription (1012) and
    /// sends its clients to the new home.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_paused_home_resumed_closes_its_sessions_and_sends_clients_on() {
        use super::super::delivery::read_until_closed;
        let all = two_sharing("ps", "work", "jobs");
        wait_for(Duration::from_secs(20), || recommend(&all[1], "subscription=work"));
        let (mut s1, home) = attach_following(&all[0], "subscription=work");
        let (paused, other) = if url(&all[0]) == home { (&all[0], &all[1]) } else { (&all[1], &all[0]) };
        assert_eq!(other.publish("jobs", &event("before")).status, 202);
        let e = take(&mut s1, 1).remove(0);
        super::super::acked::ack(&mut s1, &[&e]);
        // Acked at the home, and the other instance has that through Kafka.
        let (p, offset, _) = delivered(&e);
        for b in [paused, other] {
            // (Empty until that instance has read the subscription's offsets: waited for, not indexed.)
            wait_for(Duration::from_secs(20), || {
                (committed(b, "work").get(p as usize) == Some(&Some(offset + 1))).then_some(())
            });
        }
        let signal = |sig: &str| {
            let ok = std::process::Command::new("kill").args([sig, &paused.pid().to_string()]).status().unwrap();
            assert!(ok.success());
        };
        signal("-STOP");
        let resume = scopeguard(|| signal("-CONT"));
        // The other instance takes the subscription over once the paused one is silent.
        wait_for(Duration::from_secs(30), || (recommend(other, "subscription=work") == Some(url(other))).then_some(()));
        let (mut s2, at) = attach_following(other, "subscription=work");
        assert_eq!(at, url(other));
        assert_eq!(other.publish("jobs", &event("during")).status, 202);
        assert_eq!(take(&mut s2, 1)[0]["id"], "during", "the acknowledged event is not delivered again");
        drop(resume);
        // Resumed: it reads the claim that replaced its own and closes its session.
        let (code, _) = read_until_closed(&mut s1, Duration::from_secs(30));
        assert_eq!(code.map(u16::from), Some(1012));
        // (503 while it reads the cluster's view again after the pause: never served here.)
        wait_for(Duration::from_secs(10), || {
            let r = paused.client().get("/events/poll?subscription=work&waitMs=0");
            assert!(matches!(r.status, 307 | 503), "{}: {}", r.status, r.text());
            (r.header("location").is_some_and(|l| l.starts_with(&url(other)))).then_some(())
        });
        assert_eq!(paused.publish("jobs", &event("later")).status, 202);
        let later = take(&mut s2, 1).remove(0);
        assert_eq!(later["id"], "later");
    }

    /// Request-reply across instances: the requester waits at one instance, the responder is
    /// served by the subscription's home at another; its reply (a WebSocket reply frame, or
    /// `POST /events/reply` at any instance) is forwarded through Kafka to the instance the
    /// correlation id names, and the replier learns what became of it as if it had replied
    /// there (202; 404 once answered, or for an id no request waits for).
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn replies_reach_a_requester_waiting_at_another_instance() {
        use super::super::request::{metric, request_async};
        use serde_json::json;
        let all = two_sharing("rr", "answers", "questions");
        let (mut responder, home) = attach_following(&all[0], "subscription=answers");
        let (at_home, away) = if url(&all[0]) == home { (&all[0], &all[1]) } else { (&all[1], &all[0]) };
        let structured = || vec![("content-type".to_owned(), "application/cloudevents+json".to_owned())];
        let ask = |id: &str| {
            let body = event(id).to_string().into_bytes();
            request_async(away, "questions", 20_000, structured(), body)
        };
        // A reply frame on the responder's WebSocket at the home.
        let waiting = ask("q1");
        let req = take(&mut responder, 1).remove(0);
        super::super::acked::ack(&mut responder, &[&req]);
        let reply = |id: &str, data: Value| {
            json!({"specversion": "1.0", "id": id, "source": "/responder", "type": "answer",
                   "emcorrelationid": req["emcorrelationid"], "data": data})
        };
        let frame = json!({"type": "reply", "event": reply("a1", json!({"n": 1}))});
        responder.send(tungstenite::Message::text(frame.to_string())).unwrap();
        let (r, _) = waiting.join().unwrap();
        let r = r.expect("answered");
        assert_eq!((r.status, r.json()["data"].clone()), (200, json!({"n": 1})), "{}", r.text());
        // Again, by POST /events/reply at the home: 202, then 404 for the same reply again.
        let waiting = ask("q2");
        let req = take(&mut responder, 1).remove(0);
        super::super::acked::ack(&mut responder, &[&req]);
        let body = json!({"specversion": "1.0", "id": "a2", "source": "/responder", "type": "answer",
                          "emcorrelationid": req["emcorrelationid"], "data": {"n": 2}});
        let posted =
            at_home.client().post("/events/reply", "application/cloudevents+json", body.to_string().as_bytes());
        assert_eq!(posted.status, 202, "{}", posted.text());
        let (r, _) = waiting.join().unwrap();
        assert_eq!(r.expect("answered").json()["data"], json!({"n": 2}));
        let again = at_home.client().post("/events/reply", "application/cloudevents+json", body.to_string().as_bytes());
        again.assert_problem(404);
        assert!(metric(at_home, "evmesh_replies_cross_instance_total", "") >= 3);
        // Posted at the requester's own instance, the reply needs no forwarding.
        let waiting = ask("q3");
        let req = take(&mut responder, 1).remove(0);
        let mut body = body.clone();
        body["emcorrelationid"] = req["emcorrelationid"].clone();
        assert_eq!(
            away.client().post("/events/reply", "application/cloudevents+json", body.to_string().as_bytes()).status,
            202
        );
        assert_eq!(waiting.join().unwrap().0.expect("answered").status, 200);
    }

    /// Read amplification bounded: an instance reads from Kafka only the topics its sessions
    /// need (the subscriptions homed on it), not every topic of the cluster.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn an_instance_reads_only_the_topics_its_sessions_need() {
        use super::super::request::metric;
        let (brokers, prefix) = kafka_and_prefix("ra");
        let all = [start_in(&brokers, &prefix), start_in(&brokers, &prefix)];
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 2).then_some(()));
        let n = 6;
        for t in 0..n {
            let def = format!(r#"{{"subscription":"s{t}","topic":"t{t}","mode":"LOAD_BALANCE","start":"earliest"}}"#);
            assert_eq!(all[0].client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
        }
        // (Defined at the other instance once the definitions came through Kafka.)
        wait_for(Duration::from_secs(20), || {
            (0..n).all(|t| !committed(&all[1], &format!("s{t}")).is_empty()).then_some(())
        });
        let mut sessions: Vec<(Ws, String)> =
            (0..n).map(|t| attach_following(&all[t % 2], &format!("subscription=s{t}"))).collect();
        for i in 0..20 {
            for t in 0..n {
                let mut e = event(&format!("e{t}-{i:03}"));
                e["data"] = Value::from("x".repeat(1000));
                assert_eq!(all[0].publish(&format!("t{t}"), &e).status, 202);
            }
        }
        for (ws, _) in &mut sessions {
            for e in take(ws, 20) {
                super::super::acked::ack(ws, &[&e]);
            }
        }
        // Each instance read its homed topics' events (all the same size): its share, not all.
        let written = metric(&all[0], "evmesh_bytes_stored_total", "") as f64;
        let mut read_sum = 0.0;
        for b in &all {
            let homed = sessions.iter().filter(|(_, home)| *home == url(b)).count() as f64;
            let read = metric(b, "evmesh_kafka_tail_bytes_total", "") as f64;
            read_sum += read;
            assert!(
                read <= written * (homed + 0.5) / n as f64,
                "{} read {read} of {written} with {homed} of {n} topics",
                url(b)
            );
        }
        assert!(read_sum <= written * 1.05, "together they read {read_sum} of {written}: each topic once");
    }

    /// A request marked as sent on by another instance waits for a definition still on its
    /// way, but any client can mark one: at most 64 wait per shard, the next is answered at
    /// once (here before the 64 waiting, which are answered 404 when their wait ends).
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn requests_waiting_for_a_definition_are_capped() {
        use super::super::util::{request_bytes, Client};
        let (brokers, prefix) = kafka_and_prefix("dw");
        let b = start_in_with(&brokers, &prefix, &["--shards", "1"]);
        let path = "/events/poll?subscription=nothing&waitMs=0&evmeshRedirected=1";
        let waiting: Vec<Client> = (0..64)
            .map(|_| {
                let mut c = Client::connect(b.traffic);
                c.send_raw(&request_bytes("GET", path, &[], b""));
                c
            })
            .collect();
        // (All 64 accepted, so read and waiting, before the next; nothing defines "nothing".)
        wait_for(Duration::from_secs(10), || {
            (super::super::request::metric(&b, "evmesh_connections_accepted_total", "") >= 64).then_some(())
        });
        let next = b.client().get(path);
        let answered_next = Instant::now();
        next.assert_problem(404);
        let finished: Vec<Instant> = waiting
            .into_iter()
            .map(|mut c| {
                let r = c.read_response().expect("answered");
                assert_eq!(r.status, 404);
                Instant::now()
            })
            .collect();
        assert!(finished.iter().all(|f| *f > answered_next), "the 65th waited behind the 64");
    }

    /// `POST /session/open` asked at an instance that is not the agent's home is opened there
    /// for the caller, but never without bounds: at most 64 at once per shard (the next is
    /// sent there, 307, at once), each ended within its deadline (503) when the home does not
    /// answer. The home here advertises a socket that accepts and never answers.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn opens_at_an_agents_home_are_capped_and_end_when_it_hangs() {
        use super::super::util::{request_bytes, Client};
        let (brokers, prefix) = kafka_and_prefix("oh");
        let hang = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let hang_url = format!("http://{}", hang.local_addr().unwrap());
        let home = start_in_with(&brokers, &prefix, &["--advertised-url", &hang_url]);
        let asked = start_in_with(&brokers, &prefix, &["--shards", "1"]);
        wait_for(Duration::from_secs(20), || [&home, &asked].iter().all(|b| live(b).0.len() == 2).then_some(()));
        // Registered at the home (sent there, as its own redirect would): its claim is read.
        let r = home.client().post("/agent/register?evmeshRedirected=1", "application/json", br#"{"agentId":"far"}"#);
        assert_eq!(r.status, 201, "{}", r.text());
        says(&[&asked], "sessionId=far:00", &hang_url);
        let accepted = || super::super::request::metric(&asked, "evmesh_connections_accepted_total", "");
        let before = accepted();
        let body = br#"{"clientId":"c","agentId":"far"}"#;
        let headers = [("content-type", "application/json")];
        let waiting: Vec<Client> = (0..64)
            .map(|_| {
                let mut c = Client::connect(asked.traffic);
                c.send_raw(&request_bytes("POST", "/session/open", &headers, body));
                c
            })
            .collect();
        wait_for(Duration::from_secs(10), || (accepted() >= before + 64).then_some(()));
        let next = asked.client().post("/session/open", "application/json", body);
        let answered_next = Instant::now();
        assert_eq!((next.status, next.header("location").map(|l| l.starts_with(&hang_url))), (307, Some(true)));
        for mut c in waiting {
            let r = c.read_response().expect("answered within the deadline");
            assert_eq!(r.status, 503, "{}", r.text());
            assert!(r.text().contains("did not answer"), "{}", r.text());
        }
        let ended = answered_next.elapsed();
        assert!(ended >= Duration::from_secs(3), "the 65th was answered while the 64 waited ({ended:?})");
        drop(hang);
    }

    /// Two instances over one Kafka cluster that see each other, and a LOAD_BALANCE
    /// subscription `name` of `topic` (from the earliest event) made at the first.
    fn two_sharing(tag: &str, name: &str, topic: &str) -> [TestBroker; 2] {
        let (brokers, prefix) = kafka_and_prefix(tag);
        let all = [start_in(&brokers, &prefix), start_in(&brokers, &prefix)];
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 2).then_some(()));
        let def = format!(r#"{{"subscription":"{name}","topic":"{topic}","mode":"LOAD_BALANCE","start":"earliest"}}"#);
        assert_eq!(all[0].client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
        all
    }

    /// Runs `f` when dropped (a paused process is resumed even when an assertion fails).
    fn scopeguard(f: impl FnOnce()) -> impl Drop {
        struct Guard<F: FnOnce()>(Option<F>);
        impl<F: FnOnce()> Drop for Guard<F> {
            fn drop(&mut self) {
                if let Some(f) = self.0.take() {
                    f();
                }
            }
        }
        Guard(Some(f))
    }

    /// Waits until every instance in `of` recommends `want` for `q` (they read the claim).
    fn says(of: &[&TestBroker], q: &str, want: &str) {
        wait_for(Duration::from_secs(20), || of.iter().all(|b| recommend(b, q).as_deref() == Some(want)).then_some(()));
    }

    /// What every instance in `of` recommends for `q`, once they all agree.
    fn agreed(of: &[&TestBroker], q: &str) -> String {
        wait_for(Duration::from_secs(20), || {
            let urls: Vec<Option<String>> = of.iter().map(|b| recommend(b, q)).collect();
            (urls[0].is_some() && urls.iter().all(|u| *u == urls[0])).then(|| urls[0].clone().unwrap())
        })
    }

    /// Homes: every instance recommends the same home for a subscription (the first choice,
    /// recorded through Kafka) or a client, a subscription's answer names it, a new instance
    /// takes none of the recorded ones (sticky while the home lives), and a killed home's keys
    /// move to live ones.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn homes_are_agreed_sticky_and_move_when_their_instance_dies() {
        let (brokers, prefix) = kafka_and_prefix("hm");
        let mut all = vec![start_in(&brokers, &prefix), start_in(&brokers, &prefix), start_in(&brokers, &prefix)];
        let n = |all: &[TestBroker]| all.iter().map(|b| live(b).0.len()).min().unwrap();
        wait_for(Duration::from_secs(20), || (n(&all) == 3).then_some(()));
        // Twenty subscriptions created at one instance: each answer names its home, recorded
        // there; every instance recommends the same.
        let refs: Vec<&TestBroker> = all.iter().collect();
        let urls: Vec<String> = all.iter().map(|b| format!("http://{}", b.traffic)).collect();
        let keys: Vec<String> = (0..20).map(|i| format!("subscription=s{i}")).collect();
        // (Once it has read the claims written before it started: until then it answers 503.)
        wait_for(Duration::from_secs(20), || recommend(&all[1], "clientId=x"));
        let mut homes = Vec::new();
        for i in 0..20 {
            let def = format!(r#"{{"subscription":"s{i}","topic":"t"}}"#);
            let r = all[1].client().post("/events/subscribe", "application/json", def.as_bytes());
            assert_eq!(r.status, 201, "{}", r.text());
            homes.push(r.json()["instanceUrl"].as_str().unwrap().to_owned());
        }
        for (q, home) in keys.iter().zip(&homes) {
            assert_eq!(&agreed(&refs, q), home, "{q}");
        }
        assert!(homes.iter().all(|h| urls.contains(h)), "{homes:?}");
        assert!(urls.iter().filter(|u| homes.contains(u)).count() >= 2, "spread: {homes:?}");
        // A client's home is chosen alike everywhere (not recorded).
        assert!(urls.contains(&agreed(&refs, "clientId=c1")));
        // A fourth, idle instance: every home stays where it was recorded.
        all.push(start_in(&brokers, &prefix));
        wait_for(Duration::from_secs(20), || (n(&all) == 4).then_some(()));
        let refs: Vec<&TestBroker> = all.iter().collect();
        for (q, home) in keys.iter().zip(&homes) {
            assert_eq!(&agreed(&refs, q), home, "{q} moved while its home lives");
        }
        // The home of a subscription killed (one homed elsewhere than where it was created,
        // which records the next choice): once it is not live, every other instance agrees on
        // a new, live home for it; the keys of other homes stay.
        let k = homes.iter().position(|h| *h != urls[1]).expect("spread over two instances at least");
        let dead = urls.iter().position(|u| *u == homes[k]).unwrap();
        all[dead].kill9();
        let rest: Vec<&TestBroker> = all.iter().enumerate().filter(|(i, _)| *i != dead).map(|(_, b)| b).collect();
        wait_for(Duration::from_secs(20), || rest.iter().all(|b| live(b).0.len() == 3).then_some(()));
        let moved = agreed(&rest, &keys[k]);
        assert!(moved != homes[k] && rest.iter().any(|b| format!("http://{}", b.traffic) == moved), "{moved}");
        for (q, home) in keys.iter().zip(&homes).filter(|(_, h)| **h != homes[k]) {
            assert_eq!(&agreed(&rest, q), home, "{q}");
        }
    }

    /// A subscription made at one instance is defined at every instance (through Kafka) and
    /// served by its home: the other answers its sessions, polls and acks with 307 there; a
    /// session at the home gets what was published at the other; removed at the first, it is
    /// gone everywhere and the session is closed.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_subscription_made_at_one_instance_is_served_at_another() {
        use super::super::delivery::{attach, next_event};
        let (brokers, prefix) = kafka_and_prefix("df");
        let (a, b) = (start_in(&brokers, &prefix), start_in(&brokers, &prefix));
        let names = |x: &TestBroker| -> Vec<String> {
            let v = x.admin().get("/admin/subscriptions").json();
            v.as_array().unwrap().iter().map(|s| s["subscription"].as_str().unwrap().to_owned()).collect()
        };
        let def = br#"{"subscription":"orders-audit","topic":"orders","start":"earliest"}"#;
        let r = a.client().post("/events/subscribe", "application/json", def);
        assert_eq!(r.status, 201, "{}", r.text());
        wait_for(Duration::from_secs(20), || (names(&b) == ["orders-audit"]).then_some(()));
        // Its home serves it; the other instance sends its sessions, polls and acks there
        // (307, before any upgrade).
        let home_url = wait_for(Duration::from_secs(20), || {
            let (ha, hb) = (recommend(&a, "subscription=orders-audit"), recommend(&b, "subscription=orders-audit"));
            (ha.is_some() && ha == hb).then_some(ha).flatten()
        });
        let (home, other) = if home_url == format!("http://{}", a.traffic) { (&a, &b) } else { (&b, &a) };
        let r = other.client().get("/events/poll?subscription=orders-audit&waitMs=0");
        assert_eq!(r.status, 307, "{}", r.text());
        let location = format!("{home_url}/events/poll?subscription=orders-audit&waitMs=0&evmeshRedirected=1");
        assert_eq!(r.header("location"), Some(location.as_str()));
        // Sent on once at most: a redirected request is served where it arrives.
        let r = other.client().get("/events/poll?subscription=orders-audit&waitMs=0&evmeshRedirected=1");
        assert_eq!(r.status, 204, "served here (nothing to take): {}", r.text());
        let ack = br#"{"subscription":"orders-audit","ids":["0:0:1"]}"#;
        let r = other.client().post("/events/ack", "application/json", ack);
        let location = format!("{home_url}/events/ack?evmeshRedirected=1");
        assert_eq!((r.status, r.header("location")), (307, Some(location.as_str())));
        let stream = std::net::TcpStream::connect(other.traffic).unwrap();
        let refused =
            tungstenite::client(format!("ws://{}/events/ws?subscription=orders-audit", other.traffic), stream);
        assert!(
            matches!(refused, Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(ref r))) if r.status() == 307)
        );
        // `evmesh sub` pointed at the other instance follows the redirect to the home.
        assert_eq!(other.publish("orders", &event("o-0")).status, 202);
        let url = format!("http://{}", other.traffic);
        let mut sub = std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"))
            .args(["sub", "--url", &url, "--subscription", "orders-audit", "--max", "1"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let done = super::super::util::wait_for_or(Duration::from_secs(30), || sub.try_wait().unwrap());
        let _ = sub.kill();
        let out = sub.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(done.is_some_and(|s| s.success()), "{stdout} {stderr}");
        assert!(stdout.contains(r#""id":"o-0""#) && stderr.contains(&home_url), "{stdout} {stderr}");
        let mut ws = attach(home, "subscription=orders-audit");
        assert_eq!(other.publish("orders", &event("o-1")).status, 202);
        let got = wait_for(Duration::from_secs(20), || next_event(&mut ws));
        assert_eq!(got["id"], "o-1", "{got}");
        // A sink's subscription stays where it was made (its webhook would push from each).
        let sink = br#"{"subscription":"hook","topic":"orders","sink":"http://127.0.0.1:9/h"}"#;
        assert_eq!(a.client().post("/events/subscribe", "application/json", sink).status, 201);
        let r = a.client().post("/events/unsubscribe", "application/json", br#"{"subscription":"orders-audit"}"#);
        assert_eq!(r.status, 200, "{}", r.text());
        wait_for(Duration::from_secs(20), || names(&b).is_empty().then_some(()));
        assert_eq!(names(&a), ["hook"]);
        // The session at b was closed with the subscription.
        let closed = wait_for(Duration::from_secs(20), || match ws.read() {
            Ok(tungstenite::Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed) => Some(true),
            Ok(_) => None,
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => None,
            Err(_) => Some(true),
        });
        assert!(closed);
    }

    /// Receives (and acks) on `ws` until every id of `want` arrived, or the session closed
    /// (`Err` with the close code).
    fn receive_all(ws: &mut Ws, want: &std::collections::HashSet<String>) -> Result<(), u16> {
        let mut got = std::collections::HashSet::new();
        let start = Instant::now();
        while !want.is_subset(&got) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "missing {:?}",
                want.difference(&got).collect::<Vec<_>>()
            );
            match ws.read() {
                Ok(tungstenite::Message::Text(t)) => {
                    let e: Value = serde_json::from_str(t.as_str()).unwrap();
                    let ack = serde_json::json!({"type": "ack", "ids": [e["emdeliveryid"]]});
                    ws.send(tungstenite::Message::text(ack.to_string())).unwrap();
                    got.insert(e["id"].as_str().unwrap().to_owned());
                }
                Ok(tungstenite::Message::Close(c)) => return Err(c.map_or(0, |c| u16::from(c.code))),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("{e}"),
            }
        }
        Ok(())
    }

    /// A topic's partition count as an instance lists it.
    fn partitions_at(b: &TestBroker, topic: &str) -> Option<usize> {
        let r = b.admin().get("/admin/topics");
        assert_eq!(r.status, 200, "{}", r.text());
        let list: Vec<Value> = serde_json::from_str(&r.text()).unwrap();
        list.iter().find(|t| t["topic"] == topic).map(|t| t["partitions"].as_array().unwrap().len())
    }

    /// A topic made at one instance with a partition count other than the instances' default
    /// (2, one per shard) is the same topic at every other, with the count Kafka has: published
    /// to there (keyed events reach all 6 partitions), subscribed to, attached to (307 to the
    /// subscription's home, followed) and browsed, without a 409. Before, another instance made
    /// the topic with its own default count, found Kafka's and refused: publishes, subscribes
    /// answered 409 and attaching 404.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_topic_made_at_one_instance_is_the_same_topic_at_every_other() {
        use serde_json::json;
        let (brokers, prefix) = kafka_and_prefix("tp");
        let all: Vec<TestBroker> = (0..3).map(|_| start_in(&brokers, &prefix)).collect();
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 3).then_some(()));
        let put = |b: &TestBroker, n: u32| {
            let body = format!("{{\"partitions\":{n}}}");
            b.admin().request("PUT", "/admin/topics/orders", &[], body.as_bytes())
        };
        assert_eq!(put(&all[0], 6).status, 201);
        // The same at another instance: it exists (200); another count conflicts with Kafka's.
        assert_eq!(put(&all[1], 6).status, 200);
        let r = put(&all[2], 3);
        assert_eq!(r.status, 409, "{}", r.text());
        assert!(r.text().contains("6 partitions"), "{}", r.text());
        // Browsed at an instance that never met it: Kafka's count.
        assert_eq!(all[2].admin().get("/admin/topics/orders/partitions/5/events").status, 200);
        assert_eq!(partitions_at(&all[2], "orders"), Some(6));
        // Subscribed to at one instance, attached to at another (307 to its home, followed).
        let def = json!({"subscription": "all-orders", "topic": "orders", "start": "earliest"});
        let r = all[1].client().post("/events/subscribe", "application/json", def.to_string().as_bytes());
        assert_eq!(r.status, 201, "{}", r.text());
        // (Once its definition, written to Kafka, was read there.)
        wait_for(Duration::from_secs(20), || {
            let subs = all[2].admin().get("/admin/subscriptions").text();
            (subs.contains("all-orders") && recommend(&all[2], "subscription=all-orders").is_some()).then_some(())
        });
        let (mut ws, _) = attach_following(&all[2], "subscription=all-orders");
        // Published at every instance, as behind a plain L4 balancer.
        let mut want = std::collections::HashSet::new();
        let mut partitions = std::collections::HashSet::new();
        for i in 0..120 {
            let mut e = event(&format!("o{i}"));
            e["partitionkey"] = json!(format!("key-{i}"));
            let r = all[i % 3].publish("orders", &e);
            assert_eq!(r.status, 202, "at {}: {}", i % 3, r.text());
            let p = r.json()["partition"].as_u64().unwrap();
            assert_eq!(p, evmesh::model::placement::partition_for_key(format!("key-{i}").as_bytes(), 6).0 as u64);
            partitions.insert(p);
            want.insert(format!("o{i}"));
        }
        assert_eq!(partitions.len(), 6, "{partitions:?}");
        assert_eq!(receive_all(&mut ws, &want), Ok(()));
        // An explicit create with another count conflicts everywhere, and changes nothing.
        assert_eq!(put(&all[1], 2).status, 409);
        assert!(all.iter().all(|b| partitions_at(b, "orders") == Some(6)));
    }

    /// Grows a Kafka topic to `partitions`, as `kafka-topics --alter` does. The test broker
    /// (tansu 0.6) answers CreatePartitions with UNSUPPORTED_FEATURE; there the topic, which
    /// must hold no record yet, is deleted and made again with the new count, which is the same
    /// to its readers.
    fn grow_in_kafka(brokers: &str, topic: &str, partitions: usize) {
        use futures::executor::block_on as run;
        use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::config::ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        match run(admin.create_partitions([&NewPartitions::new(topic, partitions)], &opts)) {
            Ok(r) => assert!(r.iter().all(Result::is_ok), "{r:?}"),
            Err(KafkaError::AdminOp(RDKafkaErrorCode::UnsupportedFeature)) => {
                let r = run(admin.delete_topics(&[topic], &opts)).unwrap();
                assert!(r.iter().all(Result::is_ok), "{r:?}");
                let made = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(1));
                wait_for(Duration::from_secs(10), || {
                    run(admin.create_topics([&made], &opts)).ok()?.into_iter().all(|r| r.is_ok()).then_some(())
                });
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// A partition count grown in Kafka (an operator's `kafka-topics --alter`) is taken by
    /// every instance, never lowered, and the consumers the topic's subscriptions had read the
    /// new partitions from their start: a BROADCAST client that began at `latest` before the
    /// growth gets every event published after it at any instance, those that keys now map to
    /// the new partitions included, though it attaches again only after they were published
    /// (a consumer started there anew at `latest` would miss them). Here the growth happens
    /// while the instances are stopped and is taken as each starts again (the read at start and
    /// the periodic one, `kafka.topic_refresh_ms`, are the same `runtime::reconcile_topics`):
    /// the test broker cannot grow a topic, and a topic deleted and made again under a running
    /// instance that follows it crashes librdkafka 2.12 on the test broker's fetch answers.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_partition_count_grown_in_kafka_is_taken_by_every_instance() {
        use serde_json::json;
        let (brokers, prefix) = kafka_and_prefix("gr");
        let args = ["--kafka-topic-refresh-ms", "200"];
        let mut all: Vec<TestBroker> = (0..3).map(|_| start_in_with(&brokers, &prefix, &args)).collect();
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 3).then_some(()));
        let r = all[0].admin().request("PUT", "/admin/topics/grows", &[], br#"{"partitions":2}"#);
        assert_eq!(r.status, 201, "{}", r.text());
        let def = json!({"subscription": "fan-grows", "topic": "grows", "mode": "BROADCAST", "start": "latest"});
        let r = all[1].client().post("/events/subscribe", "application/json", def.to_string().as_bytes());
        assert_eq!(r.status, 201, "{}", r.text());
        wait_for(Duration::from_secs(20), || {
            let subs = all[2].admin().get("/admin/subscriptions").text();
            (subs.contains("fan-grows") && recommend(&all[2], "subscription=fan-grows").is_some()).then_some(())
        });
        // Client c1 begins (its positions stored at the home), then leaves.
        let (ws, home) = attach_following(&all[2], "subscription=fan-grows&clientId=c1");
        let home = all.iter().position(|b| url(b) == home).unwrap();
        wait_for(Duration::from_secs(10), || {
            let subs: Value = serde_json::from_str(&all[home].admin().get("/admin/subscriptions").text()).ok()?;
            let started = subs.to_string().matches(r#""client":"c1""#).count();
            (started == 2).then_some(())
        });
        drop(ws);
        for b in &all {
            assert_eq!(partitions_at(b, "grows"), Some(2));
        }
        for b in all.iter_mut() {
            b.kill9();
        }
        grow_in_kafka(&brokers, &format!("{prefix}grows"), 4);
        for b in all.iter_mut() {
            b.restart();
        }
        for b in &all {
            wait_for(Duration::from_secs(20), || (partitions_at(b, "grows") == Some(4)).then_some(()));
        }
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 3).then_some(()));
        let mut want = std::collections::HashSet::new();
        let mut partitions = std::collections::HashSet::new();
        for i in 0..80 {
            let key = format!("key-{i}");
            let mut e = event(&format!("g{i}"));
            e["partitionkey"] = json!(key);
            let r = all[i % 3].publish("grows", &e);
            assert_eq!(r.status, 202, "{}", r.text());
            let p = r.json()["partition"].as_u64().unwrap();
            assert_eq!(p, evmesh::model::placement::partition_for_key(key.as_bytes(), 4).0 as u64);
            partitions.insert(p);
            want.insert(format!("g{i}"));
        }
        assert_eq!(partitions.len(), 4, "{partitions:?}");
        let (mut ws, _) = wait_for(Duration::from_secs(20), || {
            recommend(&all[0], "subscription=fan-grows")?;
            Some(attach_following(&all[0], "subscription=fan-grows&clientId=c1"))
        });
        assert_eq!(receive_all(&mut ws, &want), Ok(()));
        // Nothing lowers it: an explicit create with the old count conflicts.
        assert_eq!(all[1].admin().request("PUT", "/admin/topics/grows", &[], br#"{"partitions":2}"#).status, 409);
        assert!(all.iter().all(|b| partitions_at(b, "grows") == Some(4)));
    }

    /// The SDK's consumer across home moves on three instances: its home paused past the
    /// timeout and resumed (the old home closes the session, `1012`, and the consumer asks
    /// recommend again and lands on the new home), then the new home killed (the consumer
    /// reconnects through the URLs it knows until recommend names a live home). Every event
    /// arrives; what comes twice is bounded by what was unacknowledged at each move.
    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn an_sdk_consumer_follows_its_home_through_a_1012_and_a_kill() {
        use evmesh_client::{Backoff, Client, ConnectionState, Start, Subscription};
        use futures_util::StreamExt;
        use std::collections::BTreeMap;
        use std::sync::{Arc, Mutex};
        let (brokers, prefix) = kafka_and_prefix("sdk");
        let parts = ["--default-partitions", "2"];
        let mut all: Vec<TestBroker> = (0..3).map(|_| start_in_with(&brokers, &prefix, &parts)).collect();
        wait_for(Duration::from_secs(20), || all.iter().all(|b| live(b).0.len() == 3).then_some(()));
        let def = r#"{"subscription":"work","topic":"jobs","start":"earliest"}"#;
        assert_eq!(all[0].client().post("/events/subscribe", "application/json", def.as_bytes()).status, 201);
        let home = wait_for(Duration::from_secs(20), || recommend(&all[0], "subscription=work"));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let _inside = rt.enter();
        // Every instance's URL, the home's last: the first attach asks another instance.
        let mut urls: Vec<String> = all.iter().map(url).collect();
        urls.sort_by_key(|u| *u == home);
        let mut builder = Client::builder(&urls[0])
            .backoff(Backoff { min: Duration::from_millis(50), max: Duration::from_millis(500) });
        for u in &urls[1..] {
            builder = builder.fallback_url(u);
        }
        let client = builder.build().unwrap();
        // Once every instance has the definition, the same one again through the SDK at
        // another instance is a 200, not a conflict.
        for b in &all {
            wait_for(Duration::from_secs(20), || {
                let subs = b.admin().get("/admin/subscriptions").json();
                subs.as_array().unwrap().iter().any(|s| s["subscription"] == "work").then_some(())
            });
        }
        let again = rt.block_on(client.subscribe(&Subscription::new("work", "jobs").start(Start::Earliest))).unwrap();
        assert!(!again.created);
        let window = 8;
        let mut consumer = client.consumer("work").window(window).start();
        let states = Arc::new(Mutex::new(Vec::new()));
        let mut watch = consumer.state();
        let log = states.clone();
        rt.spawn(async move {
            while watch.changed().await.is_ok() {
                let s = watch.borrow_and_update().clone();
                log.lock().unwrap().push(s);
            }
        });
        let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let got = seen.clone();
        rt.spawn(async move {
            while let Some(d) = consumer.next().await {
                let d = d.expect("the consumer never gives up on a moved home");
                *got.lock()
                    .unwrap()
                    .entry(evmesh_client::cloudevents::AttributesReader::id(&d.event).to_owned())
                    .or_default() += 1;
                d.ack();
            }
        });
        let publish_at = |bs: &[&TestBroker], range: std::ops::Range<usize>| {
            for i in range {
                let r = bs[i % bs.len()].publish("jobs", &event(&format!("e{i}")));
                assert_eq!(r.status, 202, "{}", r.text());
            }
        };
        let until = |n: usize| {
            wait_for(Duration::from_secs(60), || (seen.lock().unwrap().len() >= n).then_some(()));
        };
        let connected_at = |states: &Arc<Mutex<Vec<ConnectionState>>>| -> Option<String> {
            states.lock().unwrap().iter().rev().find_map(|s| match s {
                ConnectionState::Connected { url } => Some(url.clone()),
                _ => None,
            })
        };
        publish_at(&all.iter().collect::<Vec<_>>(), 0..40);
        until(40);
        assert!(connected_at(&states).is_some_and(|u| u.starts_with(&home)), "attached at the home {home}");
        // 1. The home paused past the timeout, then resumed: 1012, and on to the new home.
        let home_at = all.iter().position(|b| url(b) == home).unwrap();
        let signal = |pid: u32, sig: &str| {
            assert!(std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
        };
        let paused_pid = all[home_at].pid();
        signal(paused_pid, "-STOP");
        let others: Vec<&TestBroker> = all.iter().enumerate().filter(|(i, _)| *i != home_at).map(|(_, b)| b).collect();
        let new_home = wait_for(Duration::from_secs(30), || {
            recommend(others[0], "subscription=work")
                .filter(|u| *u != home && recommend(others[1], "subscription=work").as_ref() == Some(u))
        });
        publish_at(&others, 40..80);
        signal(paused_pid, "-CONT");
        until(80);
        wait_for(Duration::from_secs(30), || connected_at(&states).filter(|u| u.starts_with(&new_home)));
        assert!(
            states
                .lock()
                .unwrap()
                .iter()
                .any(|s| matches!(s, ConnectionState::Disconnected { reason, .. } if reason.contains("1012"))),
            "{:?}",
            states.lock().unwrap()
        );
        // 2. The new home killed: reconnects by itself to whichever home recommend names next.
        let new_at = all.iter().position(|b| url(b) == new_home).unwrap();
        all[new_at].kill9();
        let rest: Vec<&TestBroker> = all.iter().enumerate().filter(|(i, _)| *i != new_at).map(|(_, b)| b).collect();
        publish_at(&rest, 80..120);
        until(120);
        let third = connected_at(&states).unwrap();
        assert!(!third.starts_with(&new_home), "{third}");
        let s = seen.lock().unwrap();
        assert!((0..120).all(|i| s.contains_key(&format!("e{i}"))));
        let twice: usize = s.values().map(|n| n - 1).sum();
        // Per move at most once more per event. And per move at most the window on each shard
        // plus the events of that phase (40): the paused home sends until it reads the new
        // claim, and a killed home's acks since its offsets last reached Kafka (written
        // asynchronously; on a loaded machine that lags) are delivered again, as at-least-once
        // allows. (The old bound, the window plus 16 a move, failed CI once with 79 on a loaded
        // run: a lag of a few hundred milliseconds.)
        assert!(s.values().all(|&n| n <= 3), "{s:?}");
        assert!(twice <= 2 * (2 * window as usize + 40), "{twice} twice");
    }

    /// The test Kafka broker, and a topic prefix of this test's own (its instances share it).
    fn kafka_and_prefix(tag: &str) -> (String, String) {
        use std::hash::{BuildHasher, Hasher};
        let brokers = std::env::var("EVMESH_TEST_KAFKA")
            .expect("EVMESH_TEST_KAFKA names the test Kafka broker; scripts/test.sh installs and starts one");
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        (brokers, format!("{tag}-{}-{}-", std::process::id(), h.finish() % 1_000_000))
    }
}
