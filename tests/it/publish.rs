//! Publishing in every content mode, keep-alive, pipelining, partition keys over all shards.

use std::collections::HashMap;

use serde_json::json;

use super::util::{event, request_bytes, TestBroker};

fn murmur2_partition(key: &str, partitions: u32) -> u32 {
    (evmesh::model::placement::murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions
}

#[test]
fn structured_event_is_stored_verbatim() {
    let b = TestBroker::start(&[]);
    let ev = json!({"specversion":"1.0","id":"s-1","source":"/it","type":"t","subject":"x","count":3,"flag":false,"datacontenttype":"application/json","data":{"a":[1,2,{"b":null}]}});
    let r = b.publish("orders", &ev);
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json();
    let (p, o) = (v["partition"].as_u64().unwrap() as u32, v["offset"].as_u64().unwrap());
    let stored = b.events("orders", p);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0], (o, ev));
}

#[test]
fn binary_mode_is_stored_with_percent_decoded_attributes() {
    let b = TestBroker::start(&[]);
    let mut c = b.client();
    let r = c.request(
        "POST",
        "/events/publish?topic=bin",
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", "b-1"),
            ("ce-source", "/it%20src"),
            ("ce-type", "com.example.%C3%A9"),
            ("ce-myext", "v"),
            ("content-type", "application/json"),
        ],
        br#"{"x":1}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let p = r.json()["partition"].as_u64().unwrap() as u32;
    let stored = b.events("bin", p);
    assert_eq!(
        stored[0].1,
        json!({"specversion":"1.0","id":"b-1","source":"/it src","type":"com.example.é","myext":"v","datacontenttype":"application/json","data":{"x":1}})
    );
    // Opaque bytes come back base64-encoded.
    let r = c.request(
        "POST",
        "/events/publish?topic=bin",
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", "b-2"),
            ("ce-source", "s"),
            ("ce-type", "t"),
            ("content-type", "application/octet-stream"),
        ],
        &[0, 1, 254, 255],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let p = r.json()["partition"].as_u64().unwrap() as u32;
    let got = b.events("bin", p).into_iter().find(|(_, e)| e["id"] == "b-2").unwrap();
    assert_eq!(got.1["data_base64"], "AAH+/w==");
}

#[test]
fn batch_answers_in_request_order() {
    let b = TestBroker::start(&[]);
    let events: Vec<_> = (0..20)
        .map(|i| {
            let mut e = event(&format!("batch-{i}"));
            if i % 2 == 0 {
                e["partitionkey"] = json!(format!("k{i}"));
            }
            e
        })
        .collect();
    let r = b.client().post(
        "/events/publish?topic=batched",
        "application/cloudevents-batch+json",
        json!(events).to_string().as_bytes(),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let results = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 20);
    for (i, res) in results.iter().enumerate() {
        let (p, o) = (res["partition"].as_u64().unwrap() as u32, res["offset"].as_u64().unwrap());
        let stored = b.events("batched", p);
        let found = stored.iter().find(|(off, _)| *off == o).unwrap_or_else(|| panic!("{i} at {p}/{o}"));
        assert_eq!(found.1["id"], format!("batch-{i}"));
        if i % 2 == 0 {
            assert_eq!(p, murmur2_partition(&format!("k{i}"), 2));
        }
    }
    // An invalid element rejects the whole batch and stores nothing.
    let bad = json!([event("ok-1"), {"specversion": "1.0"}]);
    let r = b.client().post(
        "/events/publish?topic=batched2",
        "application/cloudevents-batch+json",
        bad.to_string().as_bytes(),
    );
    r.assert_problem(400);
    let topics = b.admin().get("/admin/topics").json();
    assert!(topics.as_array().unwrap().iter().all(|t| t["topic"] != "batched2"));
}

#[test]
fn keep_alive_and_pipelined_requests_are_answered_in_order() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let mut c = b.client();
    // Sequential keep-alive requests on one connection.
    for i in 0..10 {
        let r = c.post(
            "/events/publish?topic=pipe",
            "application/cloudevents+json",
            event(&format!("ka-{i}")).to_string().as_bytes(),
        );
        assert_eq!(r.status, 202);
        assert_eq!(r.json()["offset"], i);
    }
    // Fifty pipelined requests in one write, a bad one in the middle, and chunked ones.
    let mut all = Vec::new();
    for i in 10..60 {
        if i == 30 {
            all.extend(request_bytes(
                "POST",
                "/events/publish?topic=pipe",
                &[("content-type", "application/cloudevents+json")],
                b"{nope",
            ));
            continue;
        }
        let body = event(&format!("pl-{i}")).to_string();
        if i % 10 == 5 {
            let mut r = b"POST /events/publish?topic=pipe HTTP/1.1\r\nhost: t\r\ncontent-type: application/cloudevents+json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            let (a, z) = body.split_at(body.len() / 2);
            for part in [a, z] {
                r.extend(format!("{:x}\r\n{part}\r\n", part.len()).into_bytes());
            }
            r.extend(b"0\r\n\r\n");
            all.extend(r);
        } else {
            all.extend(request_bytes(
                "POST",
                "/events/publish?topic=pipe",
                &[("content-type", "application/cloudevents+json")],
                body.as_bytes(),
            ));
        }
    }
    c.send_raw(&all);
    let mut expected_offset = 10;
    for i in 10..60 {
        let r = c.read_response().expect("response");
        if i == 30 {
            r.assert_problem(400);
            continue;
        }
        assert_eq!(r.status, 202, "request {i}: {}", r.text());
        assert_eq!(r.json()["offset"], expected_offset, "request {i}");
        expected_offset += 1;
    }
    let stored = b.events("pipe", 0);
    assert_eq!(stored.len(), 59);
    assert_eq!(stored[58].1["id"], "pl-59");
}

#[test]
fn expect_100_continue_gets_an_interim_response() {
    let b = TestBroker::start(&[]);
    let mut c = b.client();
    let body = event("e-1").to_string();
    c.send_raw(format!("POST /events/publish?topic=cont HTTP/1.1\r\nhost: t\r\ncontent-type: application/cloudevents+json\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    let mut first = [0u8; 25];
    std::io::Read::read_exact(&mut c.stream, &mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send_raw(body.as_bytes());
    assert_eq!(c.read_response().unwrap().status, 202);
}

/// Many connections publish keyed events; every key lands on its murmur2 partition, the
/// partitions live on both shards, and each key's events keep their publish order.
#[test]
fn keyed_events_spread_over_shards_and_keep_order_per_partition() {
    let b = TestBroker::start(&["--default-partitions", "8"]);
    let keys: Vec<String> = (0..16).map(|k| format!("key-{k}")).collect();
    std::thread::scope(|s| {
        for t in 0..8 {
            let b = &b;
            let keys = &keys;
            s.spawn(move || {
                let mut c = b.client();
                for n in 0..40 {
                    let key = &keys[(t * 2 + n % 2) % keys.len()];
                    let mut e = event(&format!("{t}-{n}"));
                    e["partitionkey"] = json!(key);
                    e["seq"] = json!(n);
                    e["writer"] = json!(t);
                    let r =
                        c.post("/events/publish?topic=keyed", "application/cloudevents+json", e.to_string().as_bytes());
                    assert_eq!(r.status, 202, "{}", r.text());
                    assert_eq!(r.json()["partition"].as_u64().unwrap() as u32, murmur2_partition(key, 8));
                }
            });
        }
    });
    let mut owners = std::collections::HashSet::new();
    let mut total = 0;
    for p in 0..8 {
        let stored = b.events("keyed", p);
        if !stored.is_empty() {
            owners.insert(evmesh::model::placement::owner("keyed", evmesh::model::PartitionId(p), 2));
        }
        let mut last: HashMap<(i64, String), i64> = HashMap::new();
        for (i, (o, e)) in stored.iter().enumerate() {
            assert_eq!(*o, i as u64, "offsets are dense from 0");
            let key = e["partitionkey"].as_str().unwrap().to_string();
            assert_eq!(murmur2_partition(&key, 8), p);
            let slot = last.entry((e["writer"].as_i64().unwrap(), key)).or_insert(-1);
            assert!(e["seq"].as_i64().unwrap() > *slot, "order kept per writer and key");
            *slot = e["seq"].as_i64().unwrap();
        }
        total += stored.len();
    }
    assert_eq!(total, 8 * 40);
    assert_eq!(owners.len(), 2, "both shards own written partitions");
}
