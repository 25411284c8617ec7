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

/// The console is behind the admin credential: without it a browser is asked for it (`Basic`,
/// the only scheme a browser sends by itself) and gets no byte of the page; the admin token
/// as the password opens the page and the admin API it calls; only the console's three files
/// are served, each with a policy that keeps scripts and framing to this listener.
#[test]
fn the_console_is_served_only_with_the_admin_credential() {
    use base64::Engine as _;
    const TOKEN: &str = "admin-token-0123456789";
    let b = TestBroker::start(&["--admin-token", TOKEN]);
    let basic = |user: &str, pass: &str| {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
    };
    let mut a = b.admin();
    for path in ["/console", "/console/", "/console/console.js"] {
        let r = a.get(path);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("www-authenticate"), Some(r#"Basic realm="evmesh-admin""#), "{path}");
        assert!(!r.text().contains("<html") && !r.text().contains("fetch("), "{path}: {}", r.text());
        let wrong = basic("admin", "not-the-token-0123");
        let r = a.request("GET", path, &[("authorization", &wrong)], b"");
        assert_eq!(r.status, 401, "{path}");
        assert!(!r.text().contains("<html"));
    }
    // The admin API keeps asking for a bearer token (what its clients send).
    let r = a.get("/admin/topics");
    assert_eq!(r.header("www-authenticate"), Some(r#"Bearer realm="evmesh-admin""#));
    let good = basic("anyone", TOKEN);
    let page = a.request("GET", "/console", &[("authorization", &good)], b"");
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").unwrap().starts_with("text/html"));
    assert!(page.text().contains("/console/console.js"));
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.header("cache-control"), Some("no-store"));
    let js = a.request("GET", "/console/console.js", &[("authorization", &good)], b"");
    assert_eq!(js.status, 200);
    assert!(js.header("content-type").unwrap().starts_with("text/javascript"));
    for other in ["/console/../admin/topics", "/console/x.js", "/console/console.js/", "/console/a/b"] {
        assert_eq!(a.request("GET", other, &[("authorization", &good)], b"").status, 404, "{other}");
    }
    // The same password opens the admin API the page calls; a write so authenticated must
    // carry the console's header, which a form of another site cannot (the browser would send
    // the cached credential with it).
    assert_eq!(a.request("GET", "/admin/topics", &[("authorization", &good)], b"").status, 200);
    let create = |h: &[(&str, &str)]| b.admin().request("PUT", "/admin/topics/csrf", h, br#"{"partitions":1}"#);
    create(&[("authorization", &good), ("content-type", "text/plain")]).assert_problem(403);
    assert_eq!(create(&[("authorization", &good), ("x-evmesh-console", "1")]).status, 201);
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(b.admin().request("DELETE", "/admin/acl/none", &[("authorization", &bearer)], b"").status, 404);
    // A malformed Basic credential fails (401, counted), it is not taken for a missing one.
    let r = a.request("GET", "/admin/topics", &[("authorization", "Basic !!!")], b"");
    assert_eq!(r.status, 401);
    assert!(r.text().contains("unknown") || r.text().contains("invalid"), "{}", r.text());
    // Failures from one address do not lock the admin token out of it.
    for _ in 0..25 {
        let _ = b.admin().request("GET", "/admin/topics", &[("authorization", "Bearer wrong-token-0123456789")], b"");
    }
    assert_eq!(
        b.admin().request("GET", "/admin/topics", &[("authorization", "Bearer wrong-token-0123456789")], b"").status,
        429
    );
    assert_eq!(b.admin().request("GET", "/admin/topics", &[("authorization", &good)], b"").status, 200);
}

/// The stored-events listing filtered by a CESQL expression (the console's live tail): only
/// matching events, and where the next page starts whatever matched; a bad expression is 400.
#[test]
fn stored_events_filtered_by_cesql_say_where_the_next_page_starts() {
    let b = TestBroker::start(&["--shards", "1"]);
    let mut a = b.admin();
    assert_eq!(a.request("PUT", "/admin/topics/tail", &[], br#"{"partitions":1}"#).status, 201);
    for i in 0..6 {
        let mut e = event(&format!("e{i}"));
        e["type"] = if i % 3 == 0 { "com.example.hot" } else { "com.example.cold" }.into();
        assert_eq!(b.publish("tail", &e).status, 202);
    }
    let q = "/admin/topics/tail/partitions/0/events?from=1&max=4&filter=type%20%3D%20%27com.example.hot%27";
    let r = a.get(q);
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<_> =
        r.json().as_array().unwrap().iter().map(|e| e["event"]["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, ["e3"]);
    assert_eq!(r.header("evmesh-next-offset"), Some("5"));
    let r = a.get("/admin/topics/tail/partitions/0/events?from=6");
    assert_eq!(r.json().as_array().unwrap().len(), 0);
    assert_eq!(r.header("evmesh-next-offset"), Some("6"));
    a.get("/admin/topics/tail/partitions/0/events?filter=type%20%3D%3D").assert_problem(400);
    // A filter that is not UTF-8 is refused, not ignored (which would list everything).
    a.get("/admin/topics/tail/partitions/0/events?filter=%FF").assert_problem(400);
}

/// A costly CESQL expression over a page of a thousand events stops at the request's budget
/// (a few events' worth) instead of holding the admin thread: the page ends there, says so,
/// and the next one starts where it stopped, so paging reaches the end.
#[test]
fn a_costly_filter_stops_at_the_requests_budget_and_paging_goes_on() {
    let b = TestBroker::start(&["--shards", "1"]);
    let mut a = b.admin();
    assert_eq!(a.request("PUT", "/admin/topics/big", &[], br#"{"partitions":1}"#).status, 201);
    let batch: Vec<_> = (0..40).map(|i| event(&format!("b{i}"))).collect();
    let body = serde_json::to_vec(&batch).unwrap();
    let r = b.client().post("/events/publish?topic=big", "application/cloudevents-batch+json", &body);
    assert_eq!(r.status, 202, "{}", r.text());
    // Literals only: about two million steps an event, whatever the events hold.
    let sql = format!("'{}' LIKE '%{}b%'", "a".repeat(3000), "_".repeat(1000));
    let q = |from: u64| {
        let enc: String = sql.bytes().map(|c| format!("%{c:02X}")).collect();
        format!("/admin/topics/big/partitions/0/events?from={from}&max=1000&filter={enc}")
    };
    let (mut from, mut pages) = (0, 0);
    while from < 40 {
        let r = a.get(&q(from));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json().as_array().unwrap().len(), 0);
        let next: u64 = r.header("evmesh-next-offset").unwrap().parse().unwrap();
        assert!(next > from, "paging moves on: {from} -> {next}");
        if next < 40 {
            assert_eq!(r.header("evmesh-filter-exhausted"), Some("1"), "a page cut short says so");
        }
        (from, pages) = (next, pages + 1);
    }
    assert!(pages >= 5, "{pages} pages: each one stopped at the request's budget");
}

/// `log_format = json`: every line the broker writes to standard error is one JSON object
/// (the start with its configuration, refusals at a rate limit naming the limit), and a flood
/// of refusals writes a few lines a second, the rest counted in the next one written.
#[test]
fn json_log_lines_and_a_flood_of_refusals_kept_to_a_few() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let dir = std::env::temp_dir().join(format!("evmesh-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // (With an unknown EVMESH_ variable in the environment, as the test command sets some: its
    // warning is a JSON line too.)
    let mut child = Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .env("EVMESH_NOT_A_KEY", "1")
        .args(["serve", "--shards", "1", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--log-format", "json", "--log-level", "warn,start=info,limits=info", "--data-dir"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = |key: &str| -> std::net::SocketAddr {
        line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap().parse().unwrap()
    };
    let (traffic, admin) = (addr("traffic="), addr("admin="));
    let mut a = super::util::Client::connect(admin);
    let limit = br#"{"scope": "topic:flood", "eventsPerSecond": 1}"#;
    assert_eq!(a.request("PUT", "/admin/limits/slow", &[], limit).status, 201);
    let mut c = super::util::Client::connect(traffic);
    let body = event("f").to_string();
    let started_at = std::time::Instant::now();
    let refused = (0..300)
        .filter(|_| {
            c.post("/events/publish?topic=flood", "application/cloudevents+json", body.as_bytes()).status == 429
        })
        .count();
    assert!(refused >= 290, "{refused}");
    let _ = child.kill();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let lines: Vec<serde_json::Value> =
        err.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let unknown = lines.iter().find(|l| l["msg"].as_str().is_some_and(|m| m.contains("EVMESH_NOT_A_KEY")));
    assert_eq!(unknown.expect("the unknown variable said")["target"], "config");
    let started = lines.iter().find(|l| l["msg"] == "started").expect("a start line");
    assert_eq!((started["target"].as_str(), started["level"].as_str()), (Some("start"), Some("info")));
    assert_eq!(started["shards"], "1");
    let refusals: Vec<_> = lines.iter().filter(|l| l["msg"] == "refused by a rate limit").collect();
    assert!(!refusals.is_empty() && refusals[0]["limit"] == "slow" && refusals[0]["topic"] == "flood", "{refusals:?}");
    // At most 20 a second were written (the publishes took well under a few seconds).
    let took = started_at.elapsed().as_secs() as usize + 1;
    assert!(refusals.len() <= 20 * (took + 1), "{} lines for {refused} refusals in {took} s", refusals.len());
}
