//! The admin listener: health, readiness, metrics, topics.

use super::util::{event, TestBroker};

#[test]
fn health_ready_metrics_and_topics() {
    let b = TestBroker::start(&[]);
    let mut a = b.admin();
    let health = a.get("/healthz");
    assert_eq!(health.status, 200);
    assert!(health.header("date").is_some_and(|d| d.ends_with(" GMT")), "RFC 9110 Date on final responses");
    assert_eq!(a.get("/readyz").status, 200);
    assert_eq!(b.publish("seen", &event("1")).status, 202);
    assert_eq!(a.request("PUT", "/admin/topics/made", &[], br#"{"partitions":5,"retention_ms":60000}"#).status, 201);
    let topics = a.get("/admin/topics").json();
    let list = topics.as_array().unwrap();
    assert_eq!(list.len(), 2);
    let made = list.iter().find(|t| t["topic"] == "made").unwrap();
    assert_eq!(made["partitions"].as_array().unwrap().len(), 5);
    assert_eq!(made["retention_ms"], 60000);
    let seen = list.iter().find(|t| t["topic"] == "seen").unwrap();
    let ends: u64 = seen["partitions"].as_array().unwrap().iter().map(|p| p["end_offset"].as_u64().unwrap()).sum();
    assert_eq!(ends, 1);
    let m = a.get("/metrics");
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(text.contains("# TYPE evmesh_events_published_total counter"));
    let published: u64 = text
        .lines()
        .filter(|l| l.starts_with("evmesh_events_published_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(published, 1);
    assert!(text.contains("evmesh_publish_latency_seconds_count{shard=\"0\"}"));
    assert!(text.contains("evmesh_mailbox_depth{shard=\"1\"} 0"));
}

#[test]
fn a_taken_port_fails_loudly() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let dir = std::env::temp_dir().join(format!("evmesh-it-port-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--admin-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot bind 127.0.0.1:{port}")), "{err}");
}

#[test]
fn a_bad_configuration_is_refused_with_its_key() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["serve", "--durability", "sometimes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("durability"));
}
