//! Classic EventMesh HTTP (MeshMessage): requests exactly as EventMesh's Java SDK forms them
//! (`EventMeshMessageProducer` at apache/eventmesh 2527428: a POST to `/`, the `code` header and
//! lowercase client headers, an Apache `UrlEncodedFormEntity` body), answered with the classic
//! envelope and codes, stored as the CloudEvent EventMesh's own adaptor makes of them, and read
//! by a CloudEvents subscriber as a CloudEvent.

use std::time::Duration;

use serde_json::{json, Value};

use super::util::{event, wait_for, TestBroker};

/// The headers `EventMeshMessageProducer` sets for a publish (104) or request (101), with the
/// client configuration of EventMesh's HTTP demo (`HttpAbstractDemo`).
fn sdk_headers(code: &str) -> Vec<(&str, &str)> {
    vec![
        ("code", code),
        ("env", "env"),
        ("idc", "idc"),
        ("ip", "127.0.0.1"),
        ("pid", "4242"),
        ("sys", "1234"),
        ("username", "eventmesh"),
        ("passwd", "pass"),
        ("version", "1.0"),
        ("protocoltype", "eventmeshmessage"),
        ("protocoldesc", "http"),
        ("protocolversion", "1.0"),
        ("language", "JAVA"),
        ("content-type", "application/x-www-form-urlencoded; charset=UTF-8"),
    ]
}

/// An Apache `UrlEncodedFormEntity` body: `+` for a space, `%XX` for anything but
/// `[A-Za-z0-9-_.*]`, a field with no value as a bare name.
fn form(fields: &[(&str, Option<&str>)]) -> Vec<u8> {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => (b as char).to_string(),
                b' ' => "+".into(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    let parts: Vec<String> = fields
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{}={}", enc(k), enc(v)),
            None => enc(k),
        })
        .collect();
    parts.join("&").into_bytes()
}

fn publish_form<'a>(topic: &'a str, content: &'a str, seq: &'a str) -> Vec<(&'a str, Option<&'a str>)> {
    vec![
        ("producergroup", Some("DefaultProducerGroup")),
        ("topic", Some(topic)),
        ("content", Some(content)),
        ("ttl", None),
        ("bizseqno", Some(seq)),
        ("uniqueid", Some("u-1")),
    ]
}

/// The client headers alone (`idc`, `pid`, `sys`), for the path routes, with `content_type`.
fn client_headers(content_type: &str) -> Vec<(&str, &str)> {
    vec![("idc", "idc"), ("pid", "4242"), ("sys", "1234"), ("content-type", content_type)]
}

fn ret(r: &super::util::Resp) -> (u16, i64) {
    (r.status, r.json()["retCode"].as_i64().unwrap_or(-1))
}

#[test]
fn a_java_sdk_publish_is_stored_as_a_cloudevent_and_read_by_a_cloudevents_subscriber() {
    use super::delivery::{attach, next_event};
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let def = json!({"subscription": "ce-side", "topic": "classic"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut ws = attach(&b, "subscription=ce-side");
    let mut c = b.client();
    let content = r#"{"order":"A-1","note":"x y é"}"#;
    let r =
        c.request("POST", "/", &sdk_headers("104"), &form(&publish_form("classic", content, "764553018247542903411")));
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    let a = r.json();
    assert!(a["retMsg"].as_str().unwrap().starts_with("success"), "{a}");
    assert!(a["resTime"].as_i64().unwrap() > 1_700_000_000_000, "resTime is ms since the epoch: {a}");
    let stored = &b.events("classic", 0)[0].1;
    assert_eq!(
        stored,
        &json!({"specversion": "1.0", "id": "764553018247542903411", "source": "/", "type": "eventmeshmessage",
            "subject": "classic", "datacontenttype": "text/plain;charset=utf-8", "bizseqno": "764553018247542903411",
            "uniqueid": "u-1", "data": content})
    );
    let got = wait_for(Duration::from_secs(10), || next_event(&mut ws));
    assert_eq!(
        (&got["id"], &got["type"], &got["data"]),
        (&json!("764553018247542903411"), &json!("eventmeshmessage"), &json!(content))
    );
    // A CloudEvent and a classic message share the topic's offsets.
    assert_eq!(b.publish("classic", &event("ce-1")).json()["offset"], 1);
    // 107 (one message of a batch: `msg` for `content`) and `POST /eventmesh/publish` (with the
    // client headers, as every send).
    let v2 = form(&[
        ("bizseqno", Some("s-2")),
        ("topic", Some("classic")),
        ("msg", Some("m2")),
        ("producergroup", Some("g")),
    ]);
    assert_eq!(ret(&c.request("POST", "/", &sdk_headers("107"), &v2)), (200, 0));
    let path = form(&publish_form("classic", "m3", "s-3"));
    let r = c.request("POST", "/eventmesh/publish", &client_headers("application/x-www-form-urlencoded"), &path);
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    // The path route also takes a JSON object of the same fields.
    let body = json!({"topic": "classic", "content": "m4", "bizseqno": "s-4", "uniqueid": "u-4", "producergroup": "g"});
    let r = c.request("POST", "/eventmesh/publish", &client_headers("application/json"), body.to_string().as_bytes());
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    let ids: Vec<Value> = b.events("classic", 0).into_iter().map(|(_, e)| e["id"].clone()).collect();
    assert_eq!(ids, [json!("764553018247542903411"), json!("ce-1"), json!("s-2"), json!("s-3"), json!("s-4")]);
}

#[test]
fn a_classic_batch_stores_each_message_in_its_topic() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let contents = json!([
        {"bizSeqNo": "b1", "topic": "left", "msg": "one", "ttl": "4000"},
        {"bizSeqNo": "b2", "topic": "right", "msg": "two", "tag": "t"},
    ])
    .to_string();
    let body = form(&[
        ("batchId", Some("batch-1")),
        ("size", Some("2")),
        ("producerGroup", Some("g")),
        ("contents", Some(&contents)),
    ]);
    let r = b.client().request("POST", "/", &sdk_headers("102"), &body);
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    assert_eq!(b.events("left", 0)[0].1["data"], "one");
    assert_eq!(b.events("right", 0)[0].1["tag"], "t");
    // A batch whose second message is malformed (no bizSeqNo) or goes to a topic that cannot
    // be had stores nothing: every message is checked before any is stored.
    for bad in [json!({"topic": "left", "msg": "three"}), json!({"bizSeqNo": "b4", "topic": "bad topic!", "msg": "x"})]
    {
        let contents = json!([{"bizSeqNo": "b3", "topic": "left", "msg": "two-and-a-half"}, bad]).to_string();
        let body = form(&[("batchId", Some("batch-2")), ("producerGroup", Some("g")), ("contents", Some(&contents))]);
        let r = b.client().request("POST", "/", &sdk_headers("102"), &body);
        assert_eq!(ret(&r), (200, 7), "{}", r.text());
    }
    assert_eq!(b.events("left", 0).len(), 1);
}

/// A sync send (101) is a request-reply: the message is stored as a request, a CloudEvents
/// responder answers it, and the classic requester gets the reply in `retMsg` as the Java SDK
/// reads it (`{"topic","body","properties"}`); without a reply within `ttl`, retCode 4.
#[test]
fn a_classic_sync_send_gets_its_reply_in_ret_msg() {
    use super::delivery::{attach, next_event};
    use tungstenite::Message as WsMessage;
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let def = json!({"subscription": "responders", "topic": "rpc", "start": "earliest"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut ws = attach(&b, "subscription=responders");
    let addr = b.traffic;
    let requester = std::thread::spawn(move || {
        let mut fields = publish_form("rpc", "what time is it", "q-1");
        fields[3] = ("ttl", Some("10000"));
        super::util::Client::connect(addr).request("POST", "/", &sdk_headers("101"), &form(&fields))
    });
    let request = wait_for(Duration::from_secs(10), || next_event(&mut ws));
    assert_eq!((&request["id"], &request["data"]), (&json!("q-1"), &json!("what time is it")));
    let reply = json!({"specversion": "1.0", "id": "r-1", "source": "/responder", "type": "reply",
        "emcorrelationid": request["emcorrelationid"], "region": "eu", "data": "noon"});
    ws.send(WsMessage::text(json!({"type": "reply", "event": reply}).to_string())).unwrap();
    ws.send(WsMessage::text(json!({"type": "ack", "ids": [request["emdeliveryid"]]}).to_string())).unwrap();
    let r = requester.join().unwrap();
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    let msg: Value = serde_json::from_str(r.json()["retMsg"].as_str().unwrap()).unwrap();
    assert_eq!(
        (&msg["topic"], &msg["body"], &msg["properties"]["region"]),
        (&json!("rpc"), &json!("noon"), &json!("eu"))
    );
    // A classic responder answers with 301: the request's emcorrelationid in extFields.
    let requester = std::thread::spawn(move || {
        let mut fields = publish_form("rpc", "and now?", "q-3");
        fields[3] = ("ttl", Some("10000"));
        super::util::Client::connect(addr).request("POST", "/", &sdk_headers("101"), &form(&fields))
    });
    let request = wait_for(Duration::from_secs(10), || next_event(&mut ws));
    assert_eq!(request["id"], "q-3");
    let ext = json!({"emcorrelationid": request["emcorrelationid"], "zone": "z1"}).to_string();
    let reply = form(&[
        ("bizseqno", Some("r-3")),
        ("uniqueid", Some("r-3")),
        ("content", Some("one o'clock")),
        ("origtopic", Some("rpc")),
        ("extFields", Some(&ext)),
    ]);
    let r = b.client().request("POST", "/", &sdk_headers("301"), &reply);
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    let r = requester.join().unwrap();
    let msg: Value = serde_json::from_str(r.json()["retMsg"].as_str().unwrap()).unwrap();
    assert_eq!((&msg["body"], &msg["properties"]["zone"]), (&json!("one o'clock"), &json!("z1")), "{msg}");
    // The same reply again: nobody waits for it any more.
    assert_eq!(ret(&b.client().request("POST", "/", &sdk_headers("301"), &reply)), (200, 16));
    // Nobody answers this one: retCode 4 after its ttl.
    let mut fields = publish_form("rpc", "anyone?", "q-2");
    fields[3] = ("ttl", Some("300"));
    let r = b.client().request("POST", "/", &sdk_headers("101"), &form(&fields));
    assert_eq!(ret(&r), (200, 4), "{}", r.text());
}

/// What EventMesh answers a request it cannot take with, here with the same codes: 6 for the
/// client headers, 7 for the body, 2 (and HTTP 400) for an unknown code; the broker's own
/// refusals as their classic counterparts; paths with no `code` are still not found.
#[test]
fn classic_requests_are_refused_with_the_classic_codes() {
    let b = TestBroker::start(&["--max-body-bytes", "2048"]);
    let mut c = b.client();
    let ok = form(&publish_form("t", "c", "s"));
    let without =
        |name: &str| -> Vec<(&str, &str)> { sdk_headers("104").into_iter().filter(|(k, _)| *k != name).collect() };
    assert_eq!(ret(&c.request("POST", "/", &without("idc"), &ok)), (200, 6));
    let mut bad_pid = sdk_headers("104");
    bad_pid.iter_mut().find(|(k, _)| *k == "pid").unwrap().1 = "12a";
    assert_eq!(ret(&c.request("POST", "/", &bad_pid, &ok)), (200, 6));
    let mut ce = sdk_headers("104");
    ce.iter_mut().find(|(k, _)| *k == "protocoltype").unwrap().1 = "cloudevents";
    assert_eq!(ret(&c.request("POST", "/", &ce, &ok)), (200, 6));
    for drop in ["topic", "bizseqno", "uniqueid", "producergroup", "content"] {
        let fields: Vec<_> = publish_form("t", "c", "s").into_iter().filter(|(k, _)| *k != drop).collect();
        let r = c.request("POST", "/", &sdk_headers("104"), &form(&fields));
        assert_eq!(ret(&r), (200, 7), "{drop}: {}", r.text());
    }
    // The broker's checks, worded classically: a bad topic name (400 -> 7), an event over
    // max_body_bytes (413 -> 8).
    let r = c.request("POST", "/", &sdk_headers("104"), &form(&publish_form("bad topic!", "c", "s")));
    assert_eq!(ret(&r), (200, 7), "{}", r.text());
    let big = "x".repeat(3000);
    let r = c.request("POST", "/", &sdk_headers("104"), &form(&publish_form("t", &big, "s")));
    assert!(matches!(ret(&r), (413, _) | (200, 8)), "{} {}", r.status, r.text());
    // (A body over the limit ends the connection.)
    let mut c = b.client();
    assert_eq!(ret(&c.request("POST", "/", &sdk_headers("999"), &ok)), (400, 2));
    assert_eq!(ret(&c.request("POST", "/", &sdk_headers("203"), b"clientType=SUB&consumerGroup=g")), (200, 0));
    // A sync send without its ttl is a body error; so is a subscribe naming no topic.
    assert_eq!(ret(&c.request("POST", "/", &sdk_headers("101"), &ok)), (200, 7));
    let r = c.request("POST", "/", &sdk_headers("206"), &ok);
    assert_eq!(ret(&r), (200, 7));
    assert!(r.text().contains("topic is not a JSON array"), "{}", r.text());
    // Nothing refused was stored: the topic was never even created.
    assert_eq!(b.admin().get("/admin/topics/t").status, 404);
    // Classic requests count as publishes, their refusals as publish errors.
    let errors = super::request::metric(&b, "evmesh_publish_errors_total", "");
    assert!(errors >= 10, "{errors}");
    // No `code`, not a classic path: still no route.
    assert_eq!(c.request("POST", "/elsewhere", &[], b"x").status, 404);
}

/// Every classic send path refuses a send whose client headers are missing, blank or (`pid`)
/// not a number with retCode 6 and stores nothing; EventMesh's send processors answer so and
/// classic clients rely on it to find a misconfigured producer. Before, `/eventmesh/publish`
/// (and its batch) took defaults for them and stored the event. The same sends with the headers
/// are stored (or, for a reply nobody waits for, answered 16), so each path is really reached.
#[test]
fn classic_sends_without_client_headers_are_refused_on_every_path() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    assert_eq!(b.admin().request("PUT", "/admin/topics/hdr", &[], br#"{"partitions":1}"#).status, 201);
    let mut sync = publish_form("hdr", "ping", "s-101");
    sync[3] = ("ttl", Some("200"));
    let v2 = [("bizseqno", Some("s-107")), ("topic", Some("hdr")), ("msg", Some("m")), ("producergroup", Some("g"))];
    let contents = json!([{"bizSeqNo": "s-102", "topic": "hdr", "msg": "b"}]).to_string();
    let batch = form(&[("batchId", Some("b-1")), ("producerGroup", Some("g")), ("contents", Some(&contents))]);
    let json_send =
        json!({"topic": "hdr", "content": "j", "bizseqno": "s-json", "uniqueid": "u", "producergroup": "g"})
            .to_string();
    let reply = form(&[
        ("bizseqno", Some("r-1")),
        ("uniqueid", Some("r-1")),
        ("content", Some("late")),
        ("extFields", Some(r#"{"emcorrelationid":"nobody"}"#)),
    ]);
    const FORM: &str = "application/x-www-form-urlencoded; charset=UTF-8";
    /// A send path: its code header, content type and body, the retCode it gets with every
    /// client header, and the id it stores then.
    struct Send<'a> {
        path: &'a str,
        code: &'a str,
        content_type: &'a str,
        body: Vec<u8>,
        ok: i64,
        stores: Option<&'a str>,
    }
    let send = |path, code, content_type, body, ok, stores| Send { path, code, content_type, body, ok, stores };
    let sends = vec![
        send("/", "104", FORM, form(&publish_form("hdr", "c", "s-104")), 0, Some("s-104")),
        send("/", "107", FORM, form(&v2), 0, Some("s-107")),
        send("/", "102", FORM, batch.clone(), 0, Some("s-102")),
        send("/", "101", FORM, form(&sync), 4, Some("s-101")),
        send("/", "301", FORM, reply, 16, None),
        send("/eventmesh/publish", "104", FORM, form(&publish_form("hdr", "c", "s-path")), 0, Some("s-path")),
        send("/eventmesh/publish", "104", "application/json", json_send.into_bytes(), 0, Some("s-json")),
        send("/eventmesh/publish/batch", "102", FORM, batch, 0, Some("s-102")),
    ];
    let mut c = b.client();
    for Send { path, code, content_type, body, .. } in &sends {
        let full: Vec<(&str, &str)> = sdk_headers(code)
            .into_iter()
            .map(|(k, v)| if k == "content-type" { (k, *content_type) } else { (k, v) })
            .collect();
        let without = |name: &str| full.iter().copied().filter(|(k, _)| *k != name).collect::<Vec<_>>();
        let with = |name: &str, value: &'static str| {
            full.iter().map(|&(k, v)| if k == name { (k, value) } else { (k, v) }).collect::<Vec<_>>()
        };
        let defects = [
            ("no idc", without("idc")),
            ("no sys", without("sys")),
            ("no pid", without("pid")),
            ("blank idc", with("idc", "  ")),
            ("pid not a number", with("pid", "not-a-number")),
        ];
        for (defect, headers) in defects {
            let r = c.request("POST", path, &headers, body);
            assert_eq!(ret(&r), (200, 6), "{path} code {code} {content_type}, {defect}: {}", r.text());
        }
    }
    assert!(b.events("hdr", 0).is_empty(), "a refused send was stored: {:?}", b.events("hdr", 0));
    for Send { path, code, content_type, body, ok, .. } in &sends {
        let mut headers = sdk_headers(code);
        headers.iter_mut().find(|(k, _)| *k == "content-type").unwrap().1 = content_type;
        let r = c.request("POST", path, &headers, body);
        assert_eq!(ret(&r), (200, *ok), "{path} code {code} {content_type}: {}", r.text());
    }
    let stored: Vec<Value> = b.events("hdr", 0).into_iter().map(|(_, e)| e["id"].clone()).collect();
    let expected: Vec<Value> = sends.iter().filter_map(|s| s.stores).map(|id| json!(id)).collect();
    assert_eq!(stored, expected);
}

/// The headers `EventMeshHttpConsumer` sets (no protocol* headers).
fn consumer_headers(code: &str) -> Vec<(&str, &str)> {
    sdk_headers(code).into_iter().filter(|(n, _)| !n.starts_with("protocol")).collect()
}

/// A 206 or 207 as `EventMeshHttpConsumer.subscribe/unsubscribe` forms it.
fn subscribe_classic(b: &TestBroker, code: &str, topics: &Value, url: &str, group: &str) -> (u16, i64) {
    let body = form(&[("topic", Some(&topics.to_string())), ("url", Some(url)), ("consumerGroup", Some(group))]);
    let r = b.client().request("POST", "/", &consumer_headers(code), &body);
    let out = ret(&r);
    assert_eq!(out, (200, 0), "{}", r.text());
    out
}

/// A classic subscriber (206 with a push `url`) gets classic messages and CloudEvents of its
/// topic pushed as EventMesh pushes them (code 105, the push form), and its `retCode` decides:
/// 2 is tried again, 3 is refused for good (dead-lettered). 207 ends it.
#[test]
#[ignore = "needs python3 (the push receiver is written with its standard library)"]
fn a_classic_subscriber_gets_pushes_and_its_ret_code_decides() {
    use super::webhook::{dead_letters, h, Sink};
    let b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "50"]);
    let mut sink = Sink::start(json!({ "answers": {
        "b-1": [r#"200|{"retCode":2}"#, r#"200|{"retCode":1}"#],
        "ce-2": [r#"200|{"retCode":3}"#]
    } }));
    let items = json!([{"topic": "orders", "mode": "CLUSTERING", "type": "ASYNC"}]);
    subscribe_classic(&b, "206", &items, &sink.url("/sub"), "DefaultConsumerGroup");
    // The same again changes nothing.
    subscribe_classic(&b, "206", &items, &sink.url("/sub"), "DefaultConsumerGroup");
    let r = b.client().request("POST", "/", &sdk_headers("104"), &form(&publish_form("orders", "hello é", "b-1")));
    assert_eq!(ret(&r), (200, 0));
    assert_eq!(b.publish("orders", &event("ce-2")).status, 202);
    let seen = sink.wait(3).to_vec();
    let ids: Vec<(&str, &str)> = seen.iter().map(|r| (r["form"]["bizseqno"].as_str().unwrap(), h(r, "code"))).collect();
    // One event of a partition at a time: ce-2 waits for b-1's retry (it could come first).
    assert_eq!(ids, [("b-1", "105"), ("b-1", "105"), ("ce-2", "105")], "b-1 tried again after its retCode 2");
    let first = &seen[0]["form"];
    assert_eq!((first["content"].as_str(), first["topic"].as_str()), (Some("hello é"), Some("orders")));
    assert_eq!(first["uniqueId"], "u-1");
    assert_eq!(first["randomNo"], seen[1]["form"]["randomNo"], "the same push id on every attempt");
    let ext: Value = serde_json::from_str(first["extFields"].as_str().unwrap()).unwrap();
    assert_eq!(ext["uniqueid"], "u-1");
    // A CloudEvent is pushed as a structured CloudEvent in `content`.
    let ce: Value = serde_json::from_str(seen[2]["form"]["content"].as_str().unwrap()).unwrap();
    assert_eq!((ce["id"].as_str(), ce["data"].clone()), (Some("ce-2"), json!({"n": "ce-2"})));
    let dead = wait_for(Duration::from_secs(20), || dead_letters(&b, "orders").pop());
    assert_eq!((dead.1["id"].as_str(), dead.1["emdlqreason"].as_str()), (Some("ce-2"), Some("rejected")));
    // The group is an evmesh subscription; 207 with its only URL removes it.
    let subs = b.admin().get("/admin/subscriptions").json();
    assert_eq!(subs[0]["subscription"], "cg.20.DefaultConsumerGroup.orders", "{subs}");
    // Its pushes are acked by the answers: no client session or ack takes them over.
    let name = "cg.20.DefaultConsumerGroup.orders";
    b.client().get(&format!("/events/poll?subscription={name}&waitMs=0")).assert_problem(409);
    let ack = json!({"subscription": name, "ids": ["0:0:1"]}).to_string();
    b.client().post("/events/ack", "application/json", ack.as_bytes()).assert_problem(409);
    subscribe_classic(&b, "207", &json!(["orders"]), &sink.url("/sub"), "DefaultConsumerGroup");
    assert_eq!(b.admin().get("/admin/subscriptions").json(), json!([]));
    assert_eq!(sink.drain().len(), 3);
}

/// CLUSTERING URLs of a group share its events; BROADCASTING URLs each get all of them; a
/// restart keeps them; the JSON path routes do what 206/207 do.
#[test]
#[ignore = "needs python3 (the push receiver is written with its standard library)"]
fn classic_groups_share_or_broadcast_across_urls_and_survive_a_restart() {
    use super::webhook::Sink;
    let mut b = TestBroker::start(&["--default-partitions", "4"]);
    let (mut a1, mut a2, mut c1, mut c2) =
        (Sink::start(json!({})), Sink::start(json!({})), Sink::start(json!({})), Sink::start(json!({})));
    let clustering = json!([{"topic": "t", "mode": "CLUSTERING"}]);
    subscribe_classic(&b, "206", &clustering, &a1.url("/"), "shared");
    subscribe_classic(&b, "206", &clustering, &a2.url("/"), "shared");
    let broadcasting =
        json!({"url": c1.url("/"), "consumerGroup": "all", "topic": [{"topic": "t", "mode": "BROADCASTING"}]});
    let r = b.client().post("/eventmesh/subscribe/local", "application/json", broadcasting.to_string().as_bytes());
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    subscribe_classic(&b, "206", &json!([{"topic": "t", "mode": "BROADCASTING"}]), &c2.url("/"), "all");
    b.restart();
    for i in 0..20 {
        let mut e = event(&format!("e{i}"));
        e["partitionkey"] = json!(format!("k{i}"));
        assert_eq!(b.publish("t", &e).status, 202);
    }
    let ids = |s: &mut Sink, n: usize| -> Vec<String> {
        let mut v: Vec<String> = s.wait(n).iter().map(|r| r["form"]["bizseqno"].as_str().unwrap().to_owned()).collect();
        v.sort();
        v
    };
    let all: Vec<String> = {
        let mut v: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
        v.sort();
        v
    };
    assert_eq!(ids(&mut c1, 20), all, "every broadcasting URL gets every event");
    assert_eq!(ids(&mut c2, 20), all);
    let shared = wait_for(Duration::from_secs(20), || {
        let (x, y) = (a1.drain().len(), a2.drain().len());
        (x + y >= 20).then_some((x, y))
    });
    let mut both: Vec<String> =
        a1.seen.iter().chain(&a2.seen).map(|r| r["form"]["bizseqno"].as_str().unwrap().to_owned()).collect();
    both.sort();
    assert_eq!(both, all, "the clustering URLs shared them, each once: {shared:?}");
    assert!(shared.0 > 0 && shared.1 > 0, "spread over both URLs: {shared:?}");
    let un = json!({"url": c1.url("/"), "consumerGroup": "all", "topic": ["t"]});
    let r = b.client().post("/eventmesh/unsubscribe/local", "application/json", un.to_string().as_bytes());
    assert_eq!(ret(&r), (200, 0), "{}", r.text());
    assert_eq!(b.admin().get("/admin/subscriptions").json().as_array().unwrap().len(), 2, "c2 keeps the group");
}
