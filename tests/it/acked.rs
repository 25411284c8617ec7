//! Acknowledged delivery: LOAD_BALANCE / BROADCAST / MULTICAST over WebSocket, SSE and long-poll;
//! acks, nacks, redelivery, dead letters, start positions, offsets across restarts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::Message;

use super::delivery::{attach, keys, next_event, Ws};
use super::util::{event, wait_for, TestBroker};

pub(super) fn subscribe(b: &TestBroker, def: Value) {
    let r = b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
}

pub(super) fn publish_to(b: &TestBroker, topic: &str, id: &str, key: Option<&str>) -> (u64, u64) {
    let mut e = event(id);
    if let Some(k) = key {
        e["partitionkey"] = json!(k);
    }
    let r = b.publish(topic, &e);
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json();
    (v["partition"].as_u64().unwrap(), v["offset"].as_u64().unwrap())
}

/// The next event, failing after `limit`.
pub(super) fn recv(ws: &mut Ws, limit: Duration) -> Value {
    wait_for(limit, || next_event(ws))
}

/// Asserts nothing arrives for `d`.
pub(super) fn quiet(ws: &mut Ws, d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        if let Some(e) = next_event(ws) {
            panic!("unexpected delivery {e}");
        }
    }
}

pub(super) fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).unwrap();
}

pub(super) fn ack(ws: &mut Ws, events: &[&Value]) {
    let ids: Vec<&Value> = events.iter().map(|e| &e["emdeliveryid"]).collect();
    send(ws, json!({"type": "ack", "ids": ids}));
}

pub(super) fn id(e: &Value) -> &str {
    e["id"].as_str().unwrap()
}

pub(super) const LONG: Duration = Duration::from_secs(20);

/// LOAD_BALANCE: each event to exactly one session, each partition to one session in order,
/// and a leaving session's partitions (with its unacknowledged events) move to the other.
#[test]
fn load_balance_spreads_partitions_keeps_order_and_rebalances() {
    let b = TestBroker::start(&["--default-partitions", "4"]);
    subscribe(&b, json!({"subscription": "work", "topic": "jobs", "mode": "LOAD_BALANCE"}));
    let keys = keys(4);
    let mut s = [attach(&b, "subscription=work"), attach(&b, "subscription=work")];
    // Attachments reach every owner asynchronously: publish markers until each session holds
    // two whole partitions, as the settled assignment gives them.
    let mut owner_of: HashMap<u64, usize> = HashMap::new();
    let start = Instant::now();
    for round in 0.. {
        assert!(start.elapsed() < LONG, "never settled: {owner_of:?}");
        for k in &keys {
            publish_to(&b, "jobs", &format!("m{round}-{k}"), Some(k));
        }
        let mut got = 0;
        owner_of.clear();
        while got < 4 {
            for (i, ws) in s.iter_mut().enumerate() {
                while let Some(e) = next_event(ws) {
                    ack(ws, &[&e]);
                    if id(&e).starts_with(&format!("m{round}-")) {
                        owner_of.insert(e["empartition"].as_u64().unwrap(), i);
                        got += 1;
                    }
                }
            }
            assert!(start.elapsed() < LONG, "markers of round {round} lost");
        }
        if (0..2).all(|i| owner_of.values().filter(|&&o| o == i).count() == 2) {
            break;
        }
    }
    // 40 events; session 0 leaves its last event of each partition unacknowledged.
    for i in 0..40 {
        publish_to(&b, "jobs", &format!("j{i}"), Some(&keys[i % 4]));
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut unacked: Vec<String> = Vec::new();
    while seen.len() < 40 {
        assert!(start.elapsed() < LONG * 2, "got {} of 40", seen.len());
        for (i, ws) in s.iter_mut().enumerate() {
            while let Some(e) = next_event(ws) {
                let p = e["empartition"].as_u64().unwrap();
                assert_eq!(owner_of[&p], i, "partition {p} is sticky to one session");
                let o: u64 = e["emoffset"].as_str().unwrap().parse().unwrap();
                assert!(last.insert(p, o).is_none_or(|prev| prev < o), "partition {p} in order");
                assert!(seen.insert(id(&e).to_owned()), "{} delivered once", id(&e));
                let n: usize = id(&e)[1..].parse().unwrap();
                if i == 0 && n >= 36 {
                    unacked.push(id(&e).to_owned());
                } else {
                    ack(ws, &[&e]);
                }
            }
        }
    }
    assert_eq!(unacked.len(), 2);
    // Session 0 leaves: session 1 gets its unacknowledged events now, and all new events.
    let [gone, mut stay] = s;
    drop(gone);
    for i in 40..48 {
        publish_to(&b, "jobs", &format!("j{i}"), Some(&keys[i % 4]));
    }
    let mut rest: HashSet<String> = HashSet::new();
    let want: HashSet<String> = unacked.iter().cloned().chain((40..48).map(|i| format!("j{i}"))).collect();
    while rest != want {
        let e = recv(&mut stay, LONG);
        ack(&mut stay, &[&e]);
        if unacked.contains(&id(&e).to_owned()) {
            assert_eq!(e["emattempt"], 2, "a redelivery");
        }
        rest.insert(id(&e).to_owned());
    }
}

/// The dead letters of a one-partition topic, none before the DLQ topic exists.
pub(super) fn dlq(b: &TestBroker, topic: &str) -> Vec<(u64, Value)> {
    let r = b.admin().get(&format!("/admin/topics/{topic}.dlq/partitions/0/events?from=0&max=100"));
    if r.status == 404 {
        return Vec::new();
    }
    let page: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
    page.into_iter().map(|v| (v["offset"].as_u64().unwrap(), v["event"].clone())).collect()
}

/// Unacknowledged -> redelivered after the ack timeout and backoff; nacked -> redelivered;
/// after maxAttempts -> `<topic>.dlq` with the reason, and the source moves on.
#[test]
fn ack_timeouts_and_nacks_redeliver_then_dead_letter() {
    let b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "50"]);
    subscribe(
        &b,
        json!({"subscription": "q", "topic": "tasks", "mode": "LOAD_BALANCE", "ackTimeoutMs": 300, "maxAttempts": 3}),
    );
    let mut ws = attach(&b, "subscription=q");
    publish_to(&b, "tasks", "e0", None);
    let first = recv(&mut ws, LONG);
    assert_eq!((id(&first), &first["emattempt"]), ("e0", &json!(1)));
    let second = recv(&mut ws, LONG); // not acked: the timeout redelivers it
    assert_eq!((id(&second), &second["emattempt"]), ("e0", &json!(2)));
    assert_eq!(second["emoffset"], first["emoffset"]);
    send(&mut ws, json!({"type": "nack", "ids": [second["emdeliveryid"]]}));
    let third = recv(&mut ws, LONG);
    assert_eq!((id(&third), &third["emattempt"]), ("e0", &json!(3)));
    // Not acked again: the last attempt is used up, it goes to tasks.dlq.
    let dead = wait_for(LONG, || dlq(&b, "tasks").pop());
    let ev = &dead.1;
    assert_eq!(id(ev), "e0");
    assert_eq!(ev["emdlqreason"], "ack-timeout");
    assert_eq!(ev["emdlqsubscription"], "q");
    assert_eq!(ev["emdlqtopic"], "tasks");
    assert_eq!(ev["emdlqpartition"], 0);
    assert_eq!(ev["emdlqoffset"], "0");
    assert_eq!(ev["emdlqattempts"], 3);
    assert_eq!(ev["data"], json!({"n": "e0"}), "the event itself is kept");
    // Nacked three times: dead-lettered with reason nack.
    publish_to(&b, "tasks", "e1", None);
    for attempt in 1..=3 {
        let e = recv(&mut ws, LONG);
        assert_eq!((id(&e), &e["emattempt"]), ("e1", &json!(attempt)));
        send(&mut ws, json!({"type": "nack", "ids": [e["emdeliveryid"]]}));
    }
    let dead = wait_for(LONG, || dlq(&b, "tasks").into_iter().find(|(_, e)| e["id"] == "e1"));
    assert_eq!(dead.1["emdlqreason"], "nack");
    // Both are settled on the source: a new event is next, and nothing else comes back.
    publish_to(&b, "tasks", "e2", None);
    let e = recv(&mut ws, LONG);
    assert_eq!(id(&e), "e2");
    ack(&mut ws, &[&e]);
    quiet(&mut ws, Duration::from_millis(800));
    let subs = b.admin().get("/admin/subscriptions").json();
    let c = &subs[0]["partitions"][0]["consumers"][0];
    assert_eq!((c["committed"].as_u64(), c["lag"].as_u64()), (Some(3), Some(0)), "{subs}");
    // The admin API lists the dead letters and replays them to the topic, once.
    let letters = b.admin().get("/admin/dlq/tasks").json();
    let ids: Vec<&str> = letters.as_array().unwrap().iter().map(|l| l["event"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["e0", "e1"], "{letters}");
    assert_eq!(letters[0]["partition"], 0);
    let r = b.admin().post("/admin/dlq/tasks/replay", "application/json", b"");
    assert_eq!((r.status, r.json()["replayed"].as_u64()), (200, Some(2)), "{}", r.text());
    for want in ["e0", "e1"] {
        let e = recv(&mut ws, LONG);
        assert_eq!((id(&e), &e["emattempt"]), (want, &json!(1)), "replayed as a new event");
        assert!(e.get("emdlqreason").is_none(), "without the dead-letter extensions: {e}");
        ack(&mut ws, &[&e]);
    }
    assert_eq!(b.admin().get("/admin/dlq/tasks").json(), json!([]));
    assert_eq!(b.admin().post("/admin/dlq/tasks/replay", "application/json", b"").json()["replayed"], 0);
    b.admin().get("/admin/dlq/nope").assert_problem(404);
}

/// With a window of one, a partition's redelivery goes out before any newer event.
#[test]
fn redeliveries_go_ahead_of_newer_events_in_a_partition() {
    let b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "20"]);
    subscribe(&b, json!({"subscription": "o", "topic": "seq", "ackTimeoutMs": 200}));
    let mut ws = attach(&b, "subscription=o");
    send(&mut ws, json!({"type": "credit", "n": 1}));
    publish_to(&b, "seq", "s0", None);
    let e = recv(&mut ws, LONG);
    assert_eq!(id(&e), "s0");
    for i in 1..4 {
        publish_to(&b, "seq", &format!("s{i}"), None);
    }
    // s0 is not acked: the window of one holds s1..s3 back, and s0 comes again first.
    let again = recv(&mut ws, LONG);
    assert_eq!((id(&again), &again["emattempt"]), ("s0", &json!(2)));
    let mut order = Vec::new();
    ack(&mut ws, &[&again]);
    while order.len() < 3 {
        let e = recv(&mut ws, LONG);
        order.push(id(&e).to_owned());
        ack(&mut ws, &[&e]);
    }
    assert_eq!(order, ["s1", "s2", "s3"]);
}

/// An RFC 3339 UTC timestamp of now.
fn now_rfc3339() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    evmesh::adaptor::rfc3339_from_micros(t.as_micros() as i64)
}

fn ids_until_quiet(ws: &mut Ws) -> Vec<String> {
    let mut out = Vec::new();
    let start = Instant::now();
    let mut last = Instant::now();
    while last.elapsed() < Duration::from_millis(500) && start.elapsed() < LONG {
        if let Some(e) = next_event(ws) {
            ack(ws, &[&e]);
            out.push(id(&e).to_owned());
            last = Instant::now();
        }
    }
    out
}

#[test]
fn start_positions_earliest_offset_time_and_latest() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    for i in 0..3 {
        publish_to(&b, "hist", &format!("h{i}"), None);
    }
    std::thread::sleep(Duration::from_millis(5)); // distinct publish times around the mark
    let mark = now_rfc3339();
    std::thread::sleep(Duration::from_millis(5));
    for i in 3..5 {
        publish_to(&b, "hist", &format!("h{i}"), None);
    }
    subscribe(&b, json!({"subscription": "e", "topic": "hist", "start": "earliest"}));
    subscribe(&b, json!({"subscription": "o", "topic": "hist", "start": {"offset": 3}}));
    subscribe(&b, json!({"subscription": "t", "topic": "hist", "start": {"time": mark}}));
    subscribe(&b, json!({"subscription": "l", "topic": "hist", "start": "latest"}));
    subscribe(&b, json!({"subscription": "bl", "topic": "hist", "mode": "BROADCAST", "start": "latest"}));
    // Published after the subscriptions exist, before any session attaches.
    publish_to(&b, "hist", "h5", None);
    let all: Vec<String> = (0..6).map(|i| format!("h{i}")).collect();
    assert_eq!(ids_until_quiet(&mut attach(&b, "subscription=e")), all);
    assert_eq!(ids_until_quiet(&mut attach(&b, "subscription=o")), all[3..]);
    assert_eq!(ids_until_quiet(&mut attach(&b, "subscription=t")), all[3..]);
    // LOAD_BALANCE "latest" keeps what was published since the subscription was created.
    assert_eq!(ids_until_quiet(&mut attach(&b, "subscription=l")), ["h5"]);
    // A BROADCAST client starts at the end when it first attaches, and keeps its place.
    let mut client = attach(&b, "subscription=bl&clientId=c1");
    assert!(ids_until_quiet(&mut client).is_empty());
    publish_to(&b, "hist", "h6", None);
    assert_eq!(ids_until_quiet(&mut client), ["h6"]);
}

/// MULTICAST: each session's own filter decides; BROADCAST clients keep their own offsets.
#[test]
fn multicast_filters_per_session_and_broadcast_offsets_per_client() {
    let b = TestBroker::start(&["--default-partitions", "2"]);
    subscribe(&b, json!({"subscription": "mc", "topic": "paint", "mode": "MULTICAST", "start": "earliest"}));
    subscribe(&b, json!({"subscription": "bc", "topic": "paint", "mode": "BROADCAST", "start": "earliest"}));
    for (i, color) in ["red", "blue", "red", "green"].iter().enumerate() {
        let mut e = event(&format!("c{i}"));
        e["color"] = json!(color);
        assert_eq!(b.publish("paint", &e).status, 202);
    }
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let red = ids_until_quiet(&mut attach(&b, "subscription=mc&clientId=r&sql=color%20%3D%20%27red%27"));
    assert_eq!(sorted(red), ["c0", "c2"]);
    let f = "%5B%7B%22any%22%3A%5B%7B%22exact%22%3A%7B%22color%22%3A%22blue%22%7D%7D%2C%7B%22exact%22%3A%7B%22color%22%3A%22green%22%7D%7D%5D%7D%5D";
    let other = ids_until_quiet(&mut attach(&b, &format!("subscription=mc&clientId=o&filters={f}")));
    assert_eq!(sorted(other), ["c1", "c3"]);
    // BROADCAST: client a acks everything, client b only two; both come back.
    let mut a = attach(&b, "subscription=bc&clientId=a");
    assert_eq!(sorted(ids_until_quiet(&mut a)).len(), 4);
    let mut bb = attach(&b, "subscription=bc&clientId=b");
    let mut got = Vec::new();
    while got.len() < 4 {
        let e = recv(&mut bb, LONG);
        if e["id"] == "c0" || e["id"] == "c1" {
            ack(&mut bb, &[&e]);
        }
        got.push(id(&e).to_owned());
    }
    drop((a, bb));
    let subs = wait_for(LONG, || {
        let subs = b.admin().get("/admin/subscriptions").json();
        let bc = subs.as_array().unwrap().iter().find(|s| s["subscription"] == "bc").cloned().unwrap();
        let lag: u64 = bc["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["consumers"].as_array().unwrap().iter())
            .filter(|c| c["client"] == "b")
            .map(|c| c["lag"].as_u64().unwrap())
            .sum();
        (lag == 2).then_some(bc)
    });
    assert!(subs["partitions"][0]["consumers"].as_array().unwrap().iter().any(|c| c["client"] == "a"));
    // The same lag, as Prometheus gauges.
    let metrics = b.admin().get("/metrics").text();
    let lag_of_b: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("evmesh_consumer_lag{subscription=\"bc\",client=\"b\","))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(lag_of_b, 2, "{metrics}");
    assert!(ids_until_quiet(&mut attach(&b, "subscription=bc&clientId=a")).is_empty(), "a has everything");
    assert_eq!(sorted(ids_until_quiet(&mut attach(&b, "subscription=bc&clientId=b"))), ["c2", "c3"]);
}

/// An acked client that stops acking is paused at its window; the other gets everything.
#[test]
fn a_client_that_stops_acking_is_paused_and_does_not_hold_back_another() {
    let b = TestBroker::start(&["--default-partitions", "1", "--shards", "1", "--session-window", "16"]);
    subscribe(&b, json!({"subscription": "w", "topic": "flow", "mode": "BROADCAST", "start": "earliest"}));
    let mut stuck = attach(&b, "subscription=w&clientId=stuck");
    let mut fast = attach(&b, "subscription=w&clientId=fast");
    let events: Vec<Value> = (0..200).map(|i| event(&format!("f{i}"))).collect();
    let r = b.client().post(
        "/events/publish?topic=flow",
        "application/cloudevents-batch+json",
        json!(events).to_string().as_bytes(),
    );
    assert_eq!(r.status, 202);
    let mut n = 0;
    while n < 200 {
        let e = recv(&mut fast, LONG);
        assert_eq!(id(&e), format!("f{n}"));
        ack(&mut fast, &[&e]);
        n += 1;
    }
    // Its window's worth (on Kafka they may come in more than one burst, through the tail),
    // then nothing more.
    let held: Vec<Value> = (0..16).map(|_| wait_for(LONG, || next_event(&mut stuck))).collect();
    assert_eq!(id(&held[15]), "f15");
    assert!(next_event(&mut stuck).is_none(), "the window of the stuck client is 16");
    // Credit opens the window further.
    send(&mut stuck, json!({"type": "credit", "n": 20}));
    let more = wait_for(LONG, || next_event(&mut stuck));
    assert_eq!(id(&more), "f16");
}

/// Reads an SSE stream's events: (id, event JSON), undoing the chunked framing.
pub(super) struct Sse {
    r: BufReader<TcpStream>,
}

impl Sse {
    pub(super) fn open(b: &TestBroker, query: &str, last_event_id: Option<&str>) -> Sse {
        Sse::open_path(b, &format!("/events/sse?{query}"), last_event_id)
    }

    pub(super) fn open_path(b: &TestBroker, path: &str, last_event_id: Option<&str>) -> Sse {
        Sse::try_open_path(b, path, last_event_id).unwrap_or_else(|head| panic!("{head}"))
    }

    /// The stream, or the head of the answer that was not a `200` stream.
    pub(super) fn try_open_path(b: &TestBroker, path: &str, last_event_id: Option<&str>) -> Result<Sse, String> {
        let mut s = TcpStream::connect(b.traffic).unwrap();
        let extra = last_event_id.map(|l| format!("last-event-id: {l}\r\n")).unwrap_or_default();
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n{extra}\r\n").unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        let mut r = BufReader::new(s);
        let mut head = String::new();
        while !head.ends_with("\r\n\r\n") {
            assert!(r.read_line(&mut head).unwrap() > 0, "closed before the head: {head:?}");
        }
        if !head.starts_with("HTTP/1.1 200") {
            return Err(head);
        }
        assert!(
            head.contains("content-type: text/event-stream") && head.contains("transfer-encoding: chunked"),
            "{head}"
        );
        Ok(Sse { r })
    }

    pub(super) fn next(&mut self) -> (String, Value) {
        let (mut id, mut data) = (String::new(), String::new());
        loop {
            let mut size = String::new();
            self.r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0u8; n + 2];
            self.r.read_exact(&mut chunk).unwrap();
            for line in String::from_utf8(chunk[..n].to_vec()).unwrap().lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                    data.push('\n');
                }
            }
            if !data.is_empty() {
                return (id, serde_json::from_str(&data).unwrap());
            }
        }
    }
}

#[test]
fn sse_delivers_acks_over_http_and_resumes_after_last_event_id() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    subscribe(&b, json!({"subscription": "s", "topic": "feed", "start": "earliest", "ackTimeoutMs": 60000}));
    for i in 0..4 {
        publish_to(&b, "feed", &format!("x{i}"), None);
    }
    let mut sse = Sse::open(&b, "subscription=s", None);
    let mut seen = Vec::new();
    for i in 0..4 {
        let (sid, e) = sse.next();
        assert_eq!((id(&e), sid.as_str()), (format!("x{i}").as_str(), e["emdeliveryid"].as_str().unwrap()));
        seen.push(sid);
    }
    let r = b.client().post(
        "/events/ack",
        "application/json",
        json!({"subscription": "s", "ids": [seen[0]]}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 200);
    drop(sse);
    // Resuming after x2: x3 (never acked, never confirmed by Last-Event-ID) comes again.
    let mut sse = Sse::open(&b, "subscription=s", Some(&seen[2]));
    publish_to(&b, "feed", "x4", None);
    let got: Vec<String> = (0..2).map(|_| id(&sse.next().1).to_owned()).collect();
    assert_eq!(got, ["x3", "x4"]);
}

/// Regression: an SSE stream opened without a `clientId` on a BROADCAST subscription could not
/// be acked with SPEC's body (`{"subscription", "ids"}`: 400, "need a clientId"), so each of
/// its events came again every `ackTimeoutMs` and went to the dead letters, once per stream.
/// Its delivery ids now name the stream, and an ack of them settles that stream's alone.
#[test]
fn sse_streams_without_a_client_id_ack_their_own_broadcast_events() {
    let b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "20"]);
    let def = json!({"subscription": "all", "topic": "news", "mode": "BROADCAST", "start": "earliest",
        "ackTimeoutMs": 300, "maxAttempts": 2});
    subscribe(&b, def);
    let (mut one, mut two) = (Sse::open(&b, "subscription=all", None), Sse::open(&b, "subscription=all", None));
    publish_to(&b, "news", "n0", None);
    let ((id1, e1), (id2, e2)) = (one.next(), two.next());
    assert_eq!((id(&e1), id(&e2)), ("n0", "n0"));
    assert_eq!((e1["emdeliveryid"].as_str(), e2["emdeliveryid"].as_str()), (Some(&*id1), Some(&*id2)));
    assert_ne!(id1, id2, "each stream's ids name it");
    let ack = |ids: Value| {
        b.client().post(
            "/events/ack",
            "application/json",
            json!({"subscription": "all", "ids": ids}).to_string().as_bytes(),
        )
    };
    // An id naming no stream, or ids naming more than 8, are refused clearly.
    let nine: Vec<String> = (0..9).map(|n| format!("0:0:1~0.{}", 1000 + n)).collect();
    for (ids, says) in [(json!(["0:0:1"]), "need a clientId"), (json!(nine), "more than 8 SSE streams")] {
        let r = ack(ids);
        assert!(r.status == 400 && r.text().contains(says), "{} {}", r.status, r.text());
    }
    // An owned id with a clientId is refused: the client's offsets are not the stream's.
    let r = b.client().post(
        "/events/ack",
        "application/json",
        json!({"subscription": "all", "ids": [id1], "clientId": "c"}).to_string().as_bytes(),
    );
    assert!(r.status == 400 && r.text().contains("take no clientId"), "{} {}", r.status, r.text());
    // Ids of several streams (a reconnected stream's, a gone one's) are each their stream's.
    assert_eq!(ack(json!([id1, "0:0:1~1.999"])).status, 200);
    // The stream that did not ack gets n0 again, then it is dead-lettered (once: the other
    // stream's copy was acked).
    let (again, e) = two.next();
    assert_eq!(
        (id(&e), &e["emattempt"], again.split_once('~').map(|(_, o)| o)),
        ("n0", &json!(2), id2.split_once('~').map(|(_, o)| o))
    );
    let letters = wait_for(LONG, || {
        let l = b.admin().get("/admin/dlq/news").json();
        (l.as_array().is_some_and(|a| !a.is_empty())).then_some(l)
    });
    // Past both streams' ack timeouts: the acked stream's next event is the new one.
    publish_to(&b, "news", "n1", None);
    let (_, e) = one.next();
    assert_eq!((id(&e), &e["emattempt"]), ("n1", &json!(1)), "the acked n0 came again");
    assert_eq!(letters.as_array().unwrap().len(), 1, "{letters}");
    assert_eq!(b.admin().get("/admin/dlq/news").json().as_array().unwrap().len(), 1);
}

/// Regression (review): an SSE stream opened without a `clientId` that resumed with
/// `Last-Event-ID` acknowledged up to that event for the anonymous client `~<shard>.0`, which
/// is another stream (its shard's first session): that stream's event in flight was settled,
/// and it never came again.
#[test]
fn a_last_event_id_without_a_client_id_settles_no_other_streams_events() {
    let b = TestBroker::start(&["--shards", "1", "--default-partitions", "1", "--redelivery-backoff-ms", "20"]);
    let def =
        json!({"subscription": "all", "topic": "news", "mode": "BROADCAST", "start": "earliest", "ackTimeoutMs": 300});
    subscribe(&b, def);
    // The shard's first session: the anonymous client `~0.0`.
    let mut first = Sse::open(&b, "subscription=all", None);
    publish_to(&b, "news", "n0", None);
    let (id0, e) = first.next();
    assert_eq!((id(&e), id0.split_once('~').map(|(_, o)| o)), ("n0", Some("0.0")));
    // Another stream resumes after n0 without a clientId: it names no consumer of its own.
    let mut other = Sse::open(&b, "subscription=all", Some("0:0:1"));
    assert_eq!(id(&other.next().1), "n0", "an anonymous stream starts from `start`");
    // The first stream never acked n0: it comes again.
    let (_, e) = first.next();
    assert_eq!((id(&e), &e["emattempt"]), ("n0", &json!(2)));
}

#[test]
fn long_poll_batches_waits_and_redelivers_what_was_not_acked() {
    let b = TestBroker::start(&["--default-partitions", "1", "--redelivery-backoff-ms", "20"]);
    subscribe(&b, json!({"subscription": "p", "topic": "jobs", "ackTimeoutMs": 300}));
    let started = Instant::now();
    let r = b.client().get("/events/poll?subscription=p&max=10&waitMs=200");
    assert_eq!(r.status, 204);
    assert!(started.elapsed() >= Duration::from_millis(200), "waited for waitMs");
    for i in 0..3 {
        publish_to(&b, "jobs", &format!("p{i}"), None);
    }
    let r = b.client().get("/events/poll?subscription=p&max=2&waitMs=5000");
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/cloudevents-batch+json")));
    let batch: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(batch.iter().map(id).collect::<Vec<_>>(), ["p0", "p1"]);
    let r = b.client().get("/events/poll?subscription=p&max=10&waitMs=5000");
    let rest: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(rest.iter().map(id).collect::<Vec<_>>(), ["p2"]);
    // Ack p0 and p2; p1 comes back after the ack timeout.
    let ids = json!({"subscription": "p", "ids": [batch[0]["emdeliveryid"], rest[0]["emdeliveryid"]]});
    assert_eq!(b.client().post("/events/ack", "application/json", ids.to_string().as_bytes()).status, 200);
    let again = wait_for(LONG, || {
        let r = b.client().get("/events/poll?subscription=p&max=10&waitMs=1000");
        (r.status == 200).then(|| serde_json::from_slice::<Vec<Value>>(&r.body).unwrap())
    });
    assert_eq!((id(&again[0]), &again[0]["emattempt"]), ("p1", &json!(2)));
}

/// kill -9 while a consumer is acking: after the restart every event not acked before the
/// crash is delivered again, and none is skipped.
#[test]
fn offsets_survive_kill_9_and_nothing_unacked_is_skipped() {
    let mut b = TestBroker::start(&["--default-partitions", "2"]);
    subscribe(&b, json!({"subscription": "k", "topic": "crash", "start": "earliest"}));
    let keys = keys(2);
    for i in 0..200 {
        publish_to(&b, "crash", &format!("k{i}"), Some(&keys[i % 2]));
    }
    let mut ws = attach(&b, "subscription=k");
    let mut acked: HashSet<String> = HashSet::new();
    while acked.len() < 120 {
        let e = recv(&mut ws, LONG);
        ack(&mut ws, &[&e]);
        acked.insert(id(&e).to_owned());
    }
    b.kill9();
    b.restart();
    let mut ws = attach(&b, "subscription=k");
    let mut again: BTreeMap<u64, HashSet<String>> = BTreeMap::new();
    let want: HashSet<String> = (0..200).map(|i| format!("k{i}")).filter(|i| !acked.contains(i)).collect();
    let start = Instant::now();
    while !want.iter().all(|w| again.values().any(|s| s.contains(w))) {
        assert!(start.elapsed() < LONG, "missing after restart: {}", want.len());
        let Some(e) = next_event(&mut ws) else { continue };
        ack(&mut ws, &[&e]);
        again.entry(e["empartition"].as_u64().unwrap()).or_default().insert(id(&e).to_owned());
    }
}

/// Regression: a `Last-Event-ID` naming an offset that does not exist (or u64::MAX) acknowledged
/// events not yet published (or wrapped to 0 and rewound), and clamping it to the log's end
/// still acknowledged an event published while the stream reconnected: such ids are ignored.
#[test]
fn a_last_event_id_past_the_end_neither_skips_nor_rewinds() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    subscribe(&b, json!({"subscription": "s", "topic": "far", "start": "earliest", "ackTimeoutMs": 60000}));
    publish_to(&b, "far", "y0", None);
    let ack = |sid: &str| {
        let body = json!({"subscription": "s", "ids": [sid]}).to_string();
        assert_eq!(b.client().post("/events/ack", "application/json", body.as_bytes()).status, 200);
    };
    let mut sse = Sse::open(&b, "subscription=s", None);
    let (sid, e) = sse.next();
    assert_eq!(id(&e), "y0");
    ack(&sid);
    drop(sse);
    for (round, last) in [(1, "0:99999:1"), (2, &*format!("0:{}:1", u64::MAX))] {
        // Resume past the end (whether or not the owner has seen the old stream go yet), and
        // publish at once, racing the resume: the new event must still come.
        let mut sse = Sse::open(&b, "subscription=s", Some(last));
        publish_to(&b, "far", &format!("y{round}"), None);
        let (sid, e) = sse.next();
        assert_eq!(id(&e), format!("y{round}"), "nothing skipped, nothing replayed");
        ack(&sid);
        drop(sse);
    }
}

/// One pump of a partition reads a bounded number of events; a selective filter over a longer
/// backlog still finds what matches, in later turns.
#[test]
fn a_selective_filter_over_a_long_backlog_finds_its_event() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    for batch in 0..5 {
        let events: Vec<Value> = (0..1000).map(|i| event(&format!("hay-{batch}-{i}"))).collect();
        let r = b.client().post(
            "/events/publish?topic=hay",
            "application/cloudevents-batch+json",
            json!(events).to_string().as_bytes(),
        );
        assert_eq!(r.status, 202);
    }
    let mut needle = event("needle");
    needle["type"] = json!("com.example.needle");
    assert_eq!(b.publish("hay", &needle).status, 202);
    let filters = json!([{"exact": {"type": "com.example.needle"}}]);
    subscribe(&b, json!({"subscription": "n", "topic": "hay", "start": "earliest", "filters": filters}));
    let mut ws = attach(&b, "subscription=n");
    let e = recv(&mut ws, LONG);
    assert_eq!((id(&e), e["emoffset"].as_str()), ("needle", Some("5000")));
}

/// The same end-to-end delivery tests on the Kafka backend.
#[cfg(feature = "kafka")]
mod on_kafka {
    use super::super::util::{again_on_kafka, on_kafka};

    again_on_kafka!(
        load_balance_spreads_partitions_keeps_order_and_rebalances,
        ack_timeouts_and_nacks_redeliver_then_dead_letter,
        redeliveries_go_ahead_of_newer_events_in_a_partition,
        start_positions_earliest_offset_time_and_latest,
        multicast_filters_per_session_and_broadcast_offsets_per_client,
        a_client_that_stops_acking_is_paused_and_does_not_hold_back_another,
        sse_delivers_acks_over_http_and_resumes_after_last_event_id,
        long_poll_batches_waits_and_redelivers_what_was_not_acked,
        offsets_survive_kill_9_and_nothing_unacked_is_skipped,
    );
}

/// An event stream on a plain socket is one task driven by readiness (issue 32): on both I/O
/// drivers it delivers, drops what the client sends, and once its subscription is removed
/// ends its chunked body properly (`0\r\n\r\n`) and shuts the socket.
#[test]
fn an_sse_stream_ends_its_body_when_its_subscription_goes_on_both_drivers() {
    for driver in ["epoll", "uring"] {
        let b = TestBroker::start(&["--io-driver", driver]);
        let def = json!({"subscription": "s", "topic": "t"});
        assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
        let mut sse = Sse::open(&b, "subscription=s", None);
        // Bytes from the client are dropped, not taken for anything.
        sse.r.get_mut().write_all(b"anything at all\r\n").unwrap();
        assert_eq!(b.publish("t", &event("e1")).status, 202);
        assert_eq!(sse.next().1["id"], "e1", "{driver}");
        let un = json!({"subscription": "s"});
        let r = b.client().post("/events/unsubscribe", "application/json", un.to_string().as_bytes());
        assert!(r.status < 300, "{driver}: {}", r.text());
        let mut rest = Vec::new();
        sse.r.read_to_end(&mut rest).unwrap();
        assert!(rest.ends_with(b"0\r\n\r\n"), "{driver}: {:?}", String::from_utf8_lossy(&rest));
    }
}

/// The delivery tests that lean most on the log on the RocketMQ backend.
#[cfg(feature = "rocketmq")]
mod on_rocketmq {
    use super::super::util::{again_on_rocketmq, on_rocketmq};

    again_on_rocketmq!(
        load_balance_spreads_partitions_keeps_order_and_rebalances,
        ack_timeouts_and_nacks_redeliver_then_dead_letter,
        start_positions_earliest_offset_time_and_latest,
        long_poll_batches_waits_and_redelivers_what_was_not_acked,
        offsets_survive_kill_9_and_nothing_unacked_is_skipped,
    );
}
