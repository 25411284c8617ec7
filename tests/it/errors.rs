//! Every error a client can cause is a status with an application/problem+json body, and the
//! server keeps serving afterwards.

use std::io::Write;

use super::util::{event, Client, TestBroker};

#[test]
fn every_client_error_is_a_problem() {
    let b = TestBroker::start(&["--max-body-bytes", "2048", "--max-header-bytes", "1024"]);
    let ce = "application/cloudevents+json";
    let mut c = b.client();
    c.post("/events/publish?topic=t", ce, b"{").assert_problem(400);
    c.post("/events/publish?topic=t", ce, br#"{"specversion":"1.0","id":"1","source":"/s"}"#).assert_problem(400);
    c.post("/events/publish", ce, event("1").to_string().as_bytes()).assert_problem(400);
    c.post("/events/publish?topic=a/b", ce, event("1").to_string().as_bytes()).assert_problem(400);
    c.post("/events/publish?topic=t", "application/json", b"{}").assert_problem(415);
    c.post("/events/publish?topic=t", "application/cloudevents+xml", b"<e/>").assert_problem(415);
    c.request("GET", "/events/publish?topic=t", &[], b"").assert_problem(405);
    c.get("/nowhere").assert_problem(404);
    // 413 closes the connection: the body was not read.
    let big = vec![b'x'; 4096];
    b.client().post("/events/publish?topic=t", ce, &big).assert_problem(413);
    let long = "x".repeat(2000);
    b.client().request("GET", "/", &[("x-long", &long)], b"").assert_problem(431);
    let mut raw = b.client();
    raw.send_raw(b"GET / HTTP/2.0\r\nhost: t\r\n\r\n");
    raw.read_response().unwrap().assert_problem(505);
    let mut raw = b.client();
    raw.send_raw(b"GARBAGE\r\n\r\n");
    raw.read_response().unwrap().assert_problem(400);
    // A conflicting explicit topic is 409.
    let mut admin = b.admin();
    assert_eq!(admin.request("PUT", "/admin/topics/fixed", &[], br#"{"partitions":3}"#).status, 201);
    assert_eq!(admin.request("PUT", "/admin/topics/fixed", &[], br#"{"partitions":3}"#).status, 200);
    admin.request("PUT", "/admin/topics/fixed", &[], br#"{"partitions":4}"#).assert_problem(409);
    admin.request("PUT", "/admin/topics/fixed", &[], br#"{"partitions":0}"#).assert_problem(400);
    admin.get("/admin/topics/nope/partitions/0/events").assert_problem(404);
    admin.get("/admin/topics/fixed/partitions/3/events").assert_problem(404);
    admin.get("/admin/topics/fixed/partitions/0/events?from=x").assert_problem(400);
    // Still serving on the original keep-alive connection.
    assert_eq!(c.post("/events/publish?topic=t", ce, event("after").to_string().as_bytes()).status, 202);
    // The refusals that closed a connection are counted by status.
    let metrics = b.admin().get("/metrics").text();
    let refused = |status: &str| -> u64 {
        let tag = format!("status=\"{status}\"}} ");
        metrics
            .lines()
            .filter(|l| l.starts_with("evmesh_http_refused_total{"))
            .filter_map(|l| l.split_once(&tag).and_then(|(_, v)| v.parse::<u64>().ok()))
            .sum()
    };
    assert_eq!((refused("400"), refused("413"), refused("431")), (1, 1, 1), "{metrics}");
}

#[test]
fn a_stalled_request_times_out_with_408() {
    let b = TestBroker::start(&["--header-read-timeout-ms", "200"]);
    let mut c = b.client();
    c.send_raw(b"POST /events/publish?topic=t HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nabc");
    c.read_response().expect("408 before close").assert_problem(408);
    assert!(c.read_response().is_none(), "closed after 408");
}

#[test]
fn idle_connections_are_closed() {
    let b = TestBroker::start(&["--idle-timeout-ms", "100"]);
    let mut c = b.client();
    assert!(c.read_response().is_none(), "server closes an idle connection without a response");
}

#[test]
fn connections_over_the_limit_are_closed_at_accept() {
    let b = TestBroker::start(&["--max-connections", "1", "--shards", "1"]);
    let mut first = b.client();
    assert_eq!(
        first.post("/events/publish?topic=t", "application/cloudevents+json", event("1").to_string().as_bytes()).status,
        202
    );
    let mut second = Client::connect(b.traffic);
    second.send_raw(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n");
    assert!(second.read_response().is_none());
    drop(first);
    // Once the first closes, a new connection is served again.
    let r = super::util::wait_for(std::time::Duration::from_secs(10), || {
        let mut c = Client::connect(b.traffic);
        c.send_raw(b"GET /nowhere HTTP/1.1\r\nhost: t\r\n\r\n");
        c.read_response()
    });
    assert_eq!(r.status, 404);
}

/// Regression: the header timeout used to restart on every read, so a client trickling a byte at
/// a time could hold a connection forever. The whole request must now arrive in time.
#[test]
fn a_trickled_request_is_cut_off_by_the_request_deadline() {
    let b = TestBroker::start(&["--header-read-timeout-ms", "300"]);
    let mut c = b.client();
    c.send_raw(b"POST /events/publish?topic=t HTTP/1.1\r\nhost: t\r\n");
    let mut writer = c.stream.try_clone().unwrap();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = answered.clone();
    let reader = std::thread::spawn(move || {
        let r = c.read_response();
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    });
    // Up to 40 bytes, 50 ms apart: every single read is well within 300 ms, the request is not.
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if answered.load(std::sync::atomic::Ordering::SeqCst) || writer.write_all(b"x").is_err() {
            break;
        }
    }
    reader.join().unwrap().expect("a response before the request was complete").assert_problem(408);
}

/// Regression: a head that stopped arriving was closed without the 408, because the timed-out
/// read had taken the buffer that said a request had started.
#[test]
fn a_partial_head_then_silence_gets_408() {
    let b = TestBroker::start(&["--header-read-timeout-ms", "200"]);
    let mut c = b.client();
    c.send_raw(b"GET /events/publish HTTP/1.1\r\nhost");
    c.read_response().expect("408 before close").assert_problem(408);
}
