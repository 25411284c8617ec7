//! Trace context (SPEC "Observability"): a `traceparent` sent as an HTTP header is kept with the
//! event and delivered with it, an event's own is never overwritten; with `otlp_endpoint`, the
//! spans of a publish, its store, its delivery and its ack reach a collector (one that decodes
//! them with the official opentelemetry-proto messages) in the publisher's trace, with the
//! parent links right, in both of OTLP/HTTP's encodings.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::acked::subscribe;
use super::util::{event, wait_for, TestBroker};

pub(super) const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The first event a long poll of `sub` gets, acked.
fn poll_one(b: &TestBroker, sub: &str) -> Value {
    let e = wait_for(Duration::from_secs(20), || {
        let r = b.client().get(&format!("/events/poll?subscription={sub}&max=1&waitMs=1000"));
        (r.status == 200).then(|| serde_json::from_slice::<Vec<Value>>(&r.body).unwrap().remove(0))
    });
    let ids = json!({"subscription": sub, "ids": [e["emdeliveryid"]]});
    assert_eq!(b.client().post("/events/ack", "application/json", ids.to_string().as_bytes()).status, 200);
    e
}

fn publish_with(b: &TestBroker, topic: &str, headers: &[(&str, &str)], body: &Value) {
    let mut h = vec![("content-type", "application/cloudevents+json")];
    h.extend_from_slice(headers);
    let r = b.client().request("POST", &format!("/events/publish?topic={topic}"), &h, body.to_string().as_bytes());
    assert_eq!(r.status, 202, "{}", r.text());
}

#[test]
fn a_traceparent_header_travels_with_the_event_and_never_overwrites_its_own() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    subscribe(&b, json!({"subscription": "s", "topic": "t"}));
    // The header's context (and state) goes with an event that has none.
    publish_with(&b, "t", &[("traceparent", TP), ("tracestate", "vendor=1")], &event("h"));
    let e = poll_one(&b, "s");
    assert_eq!((e["traceparent"].as_str(), e["tracestate"].as_str()), (Some(TP), Some("vendor=1")));
    // The event's own context wins over the request's.
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut mine = event("own");
    mine["traceparent"] = own.into();
    publish_with(&b, "t", &[("traceparent", TP)], &mine);
    assert_eq!(poll_one(&b, "s")["traceparent"], own);
    // A header that is no traceparent is not put on the event.
    publish_with(&b, "t", &[("traceparent", "00-nothex-00f067aa0ba902b7-01")], &event("bad"));
    let e = poll_one(&b, "s");
    assert!(e.get("traceparent").is_none(), "{e}");
    // Binary mode: the event's own (ce-traceparent) is its context.
    let h = [
        ("ce-specversion", "1.0"),
        ("ce-id", "bin"),
        ("ce-source", "/it"),
        ("ce-type", "t"),
        ("ce-traceparent", own),
        ("traceparent", TP),
        ("content-type", "text/plain"),
    ];
    assert_eq!(b.client().request("POST", "/events/publish?topic=t", &h, b"x").status, 202);
    assert_eq!(poll_one(&b, "s")["traceparent"], own);
    // What a header adds is bounded: a later version's traceparent is written back as the 55
    // characters it parses to, a tracestate of another shape is left out, and a batch of tiny
    // events under one header stores no more than about twice what it sent.
    let later = format!("cc-{}-{}", &TP[3..], "x".repeat(6_000));
    publish_with(&b, "t", &[("traceparent", &later), ("tracestate", &format!("k={}", "v".repeat(6_000)))], &event("l"));
    let e = poll_one(&b, "s");
    assert_eq!((e["traceparent"].as_str(), e.get("tracestate")), (Some(TP), None));
    let big_state: Vec<String> = (0..30).map(|i| format!("k{i}={}", "v".repeat(12))).collect();
    let big_state = big_state.join(",");
    assert!(big_state.len() < 512);
    let tiny: Vec<Value> =
        (0..2000).map(|i| json!({"specversion": "1.0", "id": format!("{i}"), "source": "/", "type": "t"})).collect();
    let body = serde_json::to_vec(&tiny).unwrap();
    let h = [("content-type", "application/cloudevents-batch+json"), ("traceparent", TP), ("tracestate", &big_state)];
    assert_eq!(b.client().request("POST", "/events/publish?topic=amp", &h, &body).status, 202);
    let stored: usize = b.events("amp", 0).iter().map(|(_, e)| e.to_string().len()).sum();
    let plain: usize = tiny.iter().map(|e| e.to_string().len()).sum();
    assert!(stored < plain + body.len() + 2000 * 8, "stored {stored} bytes of JSON for a {} byte request", body.len());
    // Tracing is off (no otlp_endpoint): no context is made up.
    assert_eq!(b.publish("t", &event("plain")).status, 202);
    assert!(poll_one(&b, "s").get("traceparent").is_none());
}

/// The test collector (tests/interop/python_otlp_collector.py), killed when dropped.
pub(super) struct Collector {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Collector {
    pub(super) fn start(name: &str) -> Collector {
        let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
        let out = std::env::temp_dir().join(format!("evmesh-otlp-{name}-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&out);
        let _ = std::fs::remove_file(out.with_extension("jsonl.errors"));
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_otlp_collector.py");
        let mut child =
            Command::new(python).arg(script).arg(&out).stdout(Stdio::piped()).spawn().expect("python collector");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("collector said {line:?}"));
        Collector { child, port, out }
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far (and no export the collector could not decode).
    fn spans(&self) -> Vec<Value> {
        let errors = std::fs::read_to_string(format!("{}.errors", self.out.display())).unwrap_or_default();
        assert!(errors.is_empty(), "the collector could not decode an export: {errors}");
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// Waits for a span named `name` in trace `trace`.
    pub(super) fn span(&self, trace: &str, name: &str) -> Value {
        wait_for(Duration::from_secs(20), || {
            self.spans().into_iter().find(|s| s["trace_id"] == trace && s["name"] == name)
        })
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

const PRODUCER: u64 = 4;
const CONSUMER: u64 = 5;
const INTERNAL: u64 = 1;

/// The official OpenTelemetry SDK publishes inside a PRODUCER span (its context injected into
/// the request's headers); evmesh's spans of that publish, its store, its delivery and its ack
/// reach the collector in the same trace: publish under the SDK's span, store under publish,
/// deliver under the span the event names (the SDK's), ack under deliver. Both encodings.
#[test]
#[ignore = "needs Python with opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http and httpx (SDK_PYTHON; scripts/test.sh installs them)"]
fn an_opentelemetry_publisher_sees_publish_store_deliver_and_ack_in_its_trace() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    for protocol in ["http/protobuf", "http/json"] {
        let collector = Collector::start(protocol.trim_start_matches("http/"));
        let b = TestBroker::start(&[
            "--default-partitions",
            "1",
            "--otlp-endpoint",
            &collector.url(),
            "--otlp-protocol",
            protocol,
        ]);
        subscribe(&b, json!({"subscription": "billing", "topic": "orders"}));
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_otel_publish.py");
        let out = Command::new(&python)
            .arg(script)
            .args([&format!("http://{}", b.traffic), &collector.url(), "orders", "o-1"])
            .output()
            .expect("python");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let sent: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (trace, client_span) = (sent["trace_id"].as_str().unwrap(), sent["span_id"].as_str().unwrap());
        let delivered = poll_one(&b, "billing");
        // As the SDK wrote it (its flags too: 03, sampled and a random trace id, W3C level 2).
        let tp = delivered["traceparent"].as_str().unwrap();
        assert!(tp.starts_with(&format!("00-{trace}-{client_span}-")), "the publisher's context: {tp}");

        let client = collector.span(trace, "send orders");
        assert_eq!((client["service"].as_str(), client["span_id"].as_str()), (Some("publisher"), Some(client_span)));
        let publish = collector.span(trace, "publish orders");
        let store = collector.span(trace, "store orders");
        let deliver = collector.span(trace, "deliver billing");
        let ack = collector.span(trace, "ack billing");
        assert_eq!(publish["parent"], client_span, "{protocol}: publish is a child of the SDK's span");
        assert_eq!(store["parent"], publish["span_id"], "{protocol}: store under publish");
        assert_eq!(deliver["parent"], client_span, "{protocol}: deliver under the event's context");
        assert_eq!(ack["parent"], deliver["span_id"], "{protocol}: ack under deliver");
        let kinds: Vec<u64> = [&publish, &store, &deliver, &ack].iter().map(|s| s["kind"].as_u64().unwrap()).collect();
        assert_eq!(kinds, [PRODUCER, INTERNAL, CONSUMER, INTERNAL], "{protocol}");
        for s in [&publish, &store, &deliver, &ack] {
            assert_eq!(s["service"], "evmesh", "{s}");
            assert_eq!(s["attrs"]["messaging.system"], "evmesh", "{s}");
            assert_eq!(s["attrs"]["messaging.destination.name"], "orders", "{s}");
            assert_eq!(s["status"], 1, "ok: {s}");
            assert!(s["end"].as_u64() >= s["start"].as_u64(), "{s}");
        }
        assert_eq!(
            (publish["attrs"]["cloudevents.event_id"].as_str(), publish["attrs"]["cloudevents.event_type"].as_str()),
            (Some("o-1"), Some("com.example.traced"))
        );
        assert_eq!(store["attrs"]["messaging.evmesh.offset"], 0);
        assert_eq!(deliver["attrs"]["messaging.consumer.group.name"], "billing");
        assert_eq!(deliver["attrs"]["messaging.evmesh.attempt"], 1);
        let contents: Vec<&str> = [&publish, &ack].iter().map(|s| s["content_type"].as_str().unwrap()).collect();
        let want = if protocol == "http/json" { "application/json" } else { "application/x-protobuf" };
        assert!(contents.iter().all(|c| *c == want), "{contents:?}");
    }
}

/// Sampling where evmesh starts the trace: at ratio 1 an event without context gets one that
/// names evmesh's publish span (its delivery joins that trace, a nack and a dead letter
/// included, marked failed); at ratio 0, or under a parent that did not sample, no span is
/// recorded and no context is made up (the parent's is kept as it came).
#[test]
#[ignore = "needs Python with opentelemetry-proto (SDK_PYTHON; scripts/test.sh installs it)"]
fn evmesh_starts_traces_by_ratio_and_obeys_a_parent_that_did_not_sample() {
    let collector = Collector::start("ratio");
    let b = TestBroker::start(&["--default-partitions", "1", "--otlp-endpoint", &collector.url()]);
    subscribe(&b, json!({"subscription": "once", "topic": "root", "maxAttempts": 1}));
    assert_eq!(b.publish("root", &event("r-1")).status, 202);
    let r = b.client().get("/events/poll?subscription=once&max=1&waitMs=5000");
    let e = serde_json::from_slice::<Vec<Value>>(&r.body).unwrap().remove(0);
    let tp = e["traceparent"].as_str().expect("a context made for the event").to_owned();
    let (trace, span) = (&tp[3..35], &tp[36..52]);
    let publish = collector.span(trace, "publish root");
    assert_eq!(
        (publish["span_id"].as_str(), &publish["parent"]),
        (Some(span), &Value::Null),
        "a root, named by the event"
    );
    let nack = json!({"subscription": "once", "ids": [e["emdeliveryid"]], "nack": true});
    assert_eq!(b.client().post("/events/ack", "application/json", nack.to_string().as_bytes()).status, 200);
    let deliver = collector.span(trace, "deliver once");
    assert_eq!((deliver["parent"].as_str(), deliver["status"].as_u64()), (Some(span), Some(2)), "failed: {deliver}");
    assert_eq!(collector.span(trace, "nack once")["parent"], deliver["span_id"]);
    let dead = collector.span(trace, "dead-letter root.dlq");
    assert_eq!((dead["parent"].as_str(), dead["kind"].as_u64()), (Some(span), Some(PRODUCER)));
    assert_eq!(dead["attrs"]["messaging.evmesh.reason"], "nack");
    drop(b);

    let quiet = Collector::start("ratio0");
    let b =
        TestBroker::start(&["--default-partitions", "1", "--otlp-endpoint", &quiet.url(), "--trace-sample-ratio", "0"]);
    subscribe(&b, json!({"subscription": "s", "topic": "t"}));
    assert_eq!(b.publish("t", &event("n-1")).status, 202);
    assert!(poll_one(&b, "s").get("traceparent").is_none(), "nothing made up at ratio 0");
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    publish_with(&b, "t", &[("traceparent", unsampled)], &event("n-2"));
    assert_eq!(poll_one(&b, "s")["traceparent"], unsampled);
    // A sampled parent is recorded even at ratio 0 (parent-based): its spans arrive, and with
    // them any of the two before, had they been recorded.
    publish_with(&b, "t", &[("traceparent", TP)], &event("n-3"));
    poll_one(&b, "s");
    quiet.span(&TP[3..35], "ack s");
    let traces: std::collections::HashSet<String> =
        quiet.spans().iter().map(|s| s["trace_id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(traces.into_iter().collect::<Vec<_>>(), [&TP[3..35]], "only the sampled parent's trace");
}

/// Request-reply joins one trace: the request's span is a child of the requester's context and
/// lasts until the reply; the responder gets the requester's context on the request; the reply
/// (sent without context of its own) reaches the requester carrying the request span's, and a
/// `reply` span sits under the request. With tracing off the reply still carries the request's
/// context.
#[test]
#[ignore = "needs Python with opentelemetry-proto (SDK_PYTHON; scripts/test.sh installs it)"]
fn a_reply_joins_its_requests_trace() {
    let collector = Collector::start("rpc");
    for traced in [true, false] {
        let mut flags = vec!["--default-partitions", "1"];
        let url = collector.url();
        if traced {
            flags.extend(["--otlp-endpoint", &url]);
        }
        let b = TestBroker::start(&flags);
        subscribe(&b, json!({"subscription": "svc", "topic": "rpc"}));
        let headers = vec![
            ("content-type".to_owned(), "application/cloudevents+json".to_owned()),
            ("traceparent".to_owned(), TP.to_owned()),
        ];
        let pending = super::request::request_async(&b, "rpc", 10_000, headers, event("q").to_string().into_bytes());
        let req = poll_one(&b, "svc");
        assert_eq!(req["traceparent"], TP, "the responder sees the requester's context");
        let reply = json!({"specversion": "1.0", "id": "r", "source": "/svc", "type": "reply",
                           "emcorrelationid": req["emcorrelationid"]});
        let r = b.client().post("/events/reply", "application/cloudevents+json", reply.to_string().as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
        let answer = pending.join().unwrap().0.expect("an answer");
        assert_eq!(answer.status, 200, "{}", answer.text());
        let got: Value = serde_json::from_slice(&answer.body).unwrap();
        let tp = got["traceparent"].as_str().expect("the reply carries a context").to_owned();
        assert_eq!(&tp[3..35], &TP[3..35], "the request's trace");
        if !traced {
            assert_eq!(tp, TP, "tracing off: the request's own context");
            continue;
        }
        let request = collector.span(&TP[3..35], "request rpc");
        assert_eq!(request["parent"], &TP[36..52]);
        assert_eq!(&tp[36..52], request["span_id"].as_str().unwrap(), "the reply names the request's span");
        assert_eq!(collector.span(&TP[3..35], "store rpc")["parent"], request["span_id"]);
        assert_eq!(collector.span(&TP[3..35], "reply rpc")["parent"], request["span_id"]);
        assert!(
            request["end"].as_u64() >= collector.span(&TP[3..35], "reply rpc")["start"].as_u64(),
            "open until the reply"
        );
    }
}

/// A collector that cannot be reached: the spans are counted as failed, none as exported, and
/// publishing goes on as if tracing were off (a shard never waits for the exporter).
#[test]
fn spans_for_a_collector_nobody_answers_are_counted_as_failed_and_publishing_goes_on() {
    // A port nobody listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let b = TestBroker::start(&["--otlp-endpoint", &endpoint]);
    for i in 0..20 {
        assert_eq!(b.publish("t", &event(&format!("f{i}"))).status, 202);
    }
    let metric = |name: &str| -> u64 {
        let text = b.admin().get("/metrics").text();
        text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
    };
    // Two spans a publish (publish, store), every one of them failed.
    wait_for(Duration::from_secs(30), || (metric("evmesh_trace_spans_failed_total ") >= 40).then_some(()));
    assert_eq!(metric("evmesh_trace_spans_exported_total "), 0);
    assert_eq!(b.publish("t", &event("after")).status, 202);
}
