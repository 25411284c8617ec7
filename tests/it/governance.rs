//! Governance end to end: static tokens, the ACL from the config file and from the admin API,
//! the admin token, 401 / 403 / 429 and the audit log. JWT (minted by PyJWT) is in
//! `tests/interop/python_jwt.py`, run by `interop::python_jwt_tokens_keys_and_rotation`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::CloseCode;

use super::delivery::read_until_closed;
use super::util::{event, wait_for, Client, Resp, TestBroker};

pub const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// The SHA-256 of `secret` in hex, by coreutils (not by the code under test).
pub(super) fn sha256_hex(secret: &str) -> String {
    let mut child = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("sha256sum");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(secret.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_owned()
}

/// A directory of governance files for one test (and the data of a broker it runs there),
/// removed when dropped: every run of the suite left them all in the temporary directory.
pub(super) struct Files(PathBuf);

impl std::ops::Deref for Files {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn files(name: &str) -> Files {
    let dir = std::env::temp_dir().join(format!("evmesh-gov-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Files(dir)
}

#[test]
fn a_tests_governance_files_are_removed_with_it() {
    let (b, dir) = broker_with("removed", &[("alice", None, "alice-secret")], "", &[]);
    let path = dir.to_path_buf();
    assert!(path.join("tokens.jsonl").is_file() && path.join("evmesh.toml").is_file());
    drop(b);
    drop(dir);
    assert!(!path.exists(), "{} was left behind", path.display());
}

/// A broker with auth = token over `tokens` (principal, tenant, secret), the config file's
/// `acl` (TOML `[[acl]]` tables), the admin token and an audit log in the test's directory.
pub(super) fn broker_with(
    name: &str,
    tokens: &[(&str, Option<&str>, &str)],
    acl: &str,
    extra: &[&str],
) -> (TestBroker, Files) {
    let dir = files(name);
    let file = dir.join("tokens.jsonl");
    let mut lines = String::from("# principal, tenant, SHA-256 of the token\n");
    for (p, tenant, secret) in tokens {
        lines.push_str(&format!("{}\n", json!({"principal": p, "tenant": tenant, "sha256": sha256_hex(secret)})));
    }
    std::fs::write(&file, lines).unwrap();
    let config = dir.join("evmesh.toml");
    std::fs::write(&config, acl).unwrap();
    let audit = dir.join("audit.log");
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--auth",
        "token",
        "--auth-tokens-file",
        file.to_str().unwrap(),
        "--admin-token",
        ADMIN_TOKEN,
        "--audit-log",
        audit.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (TestBroker::start(&args), dir)
}

/// Tokens `alice-secret` (alice), `bob-secret` (bob), `ops-secret` (ops), none with a tenant,
/// and the config file's rules: alice publishes `orders.*`, bob subscribes to `billing*` on
/// `orders.*`, ops administers.
fn token_broker(name: &str, extra: &[&str]) -> (TestBroker, Files) {
    let tokens = [("alice", None, "alice-secret"), ("bob", None, "bob-secret"), ("ops", None, "ops-secret")];
    let acl = r#"
[[acl]]
id = "alice-publishes-orders"
principal = "alice"
resource = "topic:orders.*"
actions = ["PUBLISH"]
effect = "ALLOW"
priority = 10

[[acl]]
id = "bob-reads-billing"
principal = "bob"
resource = "subscription:billing*"
actions = ["SUBSCRIBE"]
effect = "ALLOW"

[[acl]]
id = "bob-reads-orders"
principal = "bob"
resource = "topic:orders.*"
actions = ["SUBSCRIBE"]
effect = "ALLOW"

[[acl]]
id = "ops-admin"
principal = "ops"
resource = "admin"
actions = ["ADMIN"]
effect = "ALLOW"
"#;
    broker_with(name, &tokens, acl, extra)
}

/// One ALLOW rule of the config file's ACL.
fn rule(id: &str, who: &str, resource: &str, action: &str) -> String {
    format!(
        "[[acl]]\nid = \"{id}\"\nprincipal = \"{who}\"\nresource = \"{resource}\"\nactions = [\"{action}\"]\neffect = \"ALLOW\"\n"
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn publish_as(c: &mut Client, token: Option<&str>, topic: &str, id: &str) -> Resp {
    let auth = token.map(bearer);
    let mut headers = vec![("content-type", "application/cloudevents+json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    c.request("POST", &format!("/events/publish?topic={topic}"), &headers, event(id).to_string().as_bytes())
}

/// A WebSocket session at `path` opened with `token` as the bearer credential (reads time out
/// after 50 ms).
fn ws_as(b: &TestBroker, path: &str, token: &str) -> tungstenite::WebSocket<TcpStream> {
    let stream = TcpStream::connect(b.traffic).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{}{path}", b.traffic)).unwrap();
    req.headers_mut().insert("authorization", bearer(token).parse().unwrap());
    let ws = tungstenite::client(req, stream).unwrap().0;
    ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    ws
}

/// POSTs `body` (JSON) to `path` with `token` as the bearer credential.
fn post_as(c: &mut Client, token: &str, path: &str, body: &Value) -> Resp {
    let auth = bearer(token);
    c.request(
        "POST",
        path,
        &[("content-type", "application/json"), ("authorization", &auth)],
        body.to_string().as_bytes(),
    )
}

fn admin_as(b: &TestBroker, token: Option<&str>, method: &str, path: &str, body: &Value) -> Resp {
    let auth = token.map(bearer);
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    let body = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
    b.admin().request(method, path, &headers, &body)
}

/// The audit log's lines; a last line the writer has not finished yet is left out.
fn audit_lines(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("audit.log")).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn auth_none_is_refused_on_a_listener_that_is_not_loopback() {
    let dir = files("none-public");
    let out = Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["serve", "--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid auth") && err.contains("0.0.0.0"), "{err}");
    // The same address with auth on starts (and is stopped at once).
    let tokens = dir.join("t.jsonl");
    std::fs::write(&tokens, "").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["serve", "--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0", "--auth", "token"])
        .arg("--auth-tokens-file")
        .arg(&tokens)
        .arg("--data-dir")
        .arg(dir.join("data2"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert!(line.contains("traffic="), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn static_tokens_401_403_and_a_verified_keep_alive_publisher() {
    let (b, dir) = token_broker("tokens", &[]);
    let mut c = b.client();
    // No credentials: 401 with the Bearer challenge; a token nobody issued: 401 too.
    let r = publish_as(&mut c, None, "orders.eu", "e0");
    r.assert_problem(401);
    assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"), "{:?}", r.headers);
    let r = publish_as(&mut c, Some("mallory-guess"), "orders.eu", "e0");
    r.assert_problem(401);
    assert!(r.header("www-authenticate").unwrap().contains("invalid_token"));
    // alice may publish orders.*, on one keep-alive connection, again and again.
    for i in 0..5 {
        let r = publish_as(&mut c, Some("alice-secret"), "orders.eu", &format!("a{i}"));
        assert_eq!(r.status, 202, "{}", r.text());
    }
    // ... but nothing else; bob may not publish at all (no rule: default deny).
    let r = publish_as(&mut c, Some("alice-secret"), "payments", "x");
    r.assert_problem(403);
    assert!(r.json()["detail"].as_str().unwrap().contains("alice may not PUBLISH topic:payments"));
    publish_as(&mut c, Some("bob-secret"), "orders.eu", "x").assert_problem(403);
    // A different token on the same connection is verified afresh.
    assert_eq!(publish_as(&mut c, Some("alice-secret"), "orders.us", "a9").status, 202);
    // Only alice's five events were stored in orders.eu.
    let stored: usize = (0..2)
        .map(|p| {
            let path = format!("/admin/topics/orders.eu/partitions/{p}/events?from=0&max=100");
            let r = admin_as(&b, Some(ADMIN_TOKEN), "GET", &path, &Value::Null);
            assert_eq!(r.status, 200, "{}", r.text());
            r.json().as_array().unwrap().len()
        })
        .sum();
    assert_eq!(stored, 5);
    // The refusals are in the audit log (written by its own thread: wait for it).
    let lines = wait_for(Duration::from_secs(10), || {
        let l = audit_lines(&dir);
        (l.iter().filter(|l| l["outcome"] == "denied").count() >= 2).then_some(l)
    });
    assert!(lines.iter().any(|l| l["principal"] == "alice"
        && l["action"] == "PUBLISH"
        && l["resource"] == "topic:payments"
        && l["outcome"] == "denied"));
    assert!(lines.iter().any(|l| l["outcome"] == "unauthenticated" && l["detail"] == "unknown token"));
}

#[test]
fn subscribing_attaching_polling_acking_and_last_event_id_all_need_subscribe() {
    let (b, _dir) = token_broker("subscribe", &["--redelivery-backoff-ms", "50"]);
    let mut c = b.client();
    let sub = json!({"subscription": "billing", "topic": "orders.eu", "mode": "LOAD_BALANCE", "start": "earliest"});
    let (bob, alice) = ("bob-secret", "alice-secret");
    // alice may publish, not subscribe; bob may subscribe to billing* on orders.*.
    post_as(&mut c, alice, "/events/subscribe", &sub).assert_problem(403);
    assert_eq!(post_as(&mut c, bob, "/events/subscribe", &sub).status, 201);
    let other = json!({"subscription": "billing-all", "topic": "payments", "mode": "LOAD_BALANCE"});
    let r = post_as(&mut c, bob, "/events/subscribe", &other);
    r.assert_problem(403);
    assert!(r.text().contains("topic:payments"), "the topic needs SUBSCRIBE too: {}", r.text());
    for i in 0..3 {
        assert_eq!(publish_as(&mut c, Some("alice-secret"), "orders.eu", &format!("e{i}")).status, 202);
    }
    // alice cannot poll, ack, attach, resume with Last-Event-ID, or unsubscribe bob's subscription.
    let get = |c: &mut Client, who: &str, path: &str, extra: &[(&str, &str)]| {
        let auth = bearer(who);
        let mut h = vec![("authorization", auth.as_str())];
        h.extend_from_slice(extra);
        c.request("GET", path, &h, b"")
    };
    get(&mut c, alice, "/events/poll?subscription=billing&waitMs=0", &[]).assert_problem(403);
    get(&mut c, alice, "/events/sse?subscription=billing", &[("last-event-id", "0-2")]).assert_problem(403);
    post_as(&mut c, alice, "/events/ack", &json!({"subscription": "billing", "ids": ["0-0"]})).assert_problem(403);
    post_as(&mut c, alice, "/events/unsubscribe", &json!({"subscription": "billing"})).assert_problem(403);
    let stream = TcpStream::connect(b.traffic).unwrap();
    let url = format!("ws://{}/events/ws?subscription=billing&access_token=alice-secret", b.traffic);
    match tungstenite::client(url, stream) {
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => assert_eq!(resp.status(), 403),
        other => panic!("alice attached: {:?}", other.map(|_| ())),
    }
    // bob polls all three (nothing was skipped by alice's attempts), and acks them.
    let mut got = Vec::new();
    while got.len() < 3 {
        let r = get(&mut c, bob, "/events/poll?subscription=billing&max=10&waitMs=2000", &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        got.extend(r.json().as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_owned()));
    }
    got.sort();
    assert_eq!(got, ["e0", "e1", "e2"]);
}

#[test]
fn acl_rules_from_the_admin_api_apply_on_every_shard_persist_and_revoke_sessions() {
    let (mut b, _dir) = token_broker("acl-api", &["--ws-ping-interval-ms", "60000"]);
    // carol is not in the config's rules: she may do nothing, on any connection (either shard).
    let rule = json!({"principal": "bob", "resource": "topic:metrics.*", "actions": ["PUBLISH"], "effect": "ALLOW", "priority": 5});
    let denied_everywhere = |b: &TestBroker| {
        (0..8).all(|i| publish_as(&mut b.client(), Some("bob-secret"), "metrics.cpu", &format!("d{i}")).status == 403)
    };
    assert!(denied_everywhere(&b));
    // Admin writes need credentials: none 401, bob's token 403 (no ADMIN), ops and the admin token OK.
    admin_as(&b, None, "PUT", "/admin/acl/bob-metrics", &rule).assert_problem(401);
    admin_as(&b, Some("bob-secret"), "PUT", "/admin/acl/bob-metrics", &rule).assert_problem(403);
    admin_as(&b, Some("not-a-token"), "GET", "/admin/acl", &Value::Null).assert_problem(401);
    let r = admin_as(&b, Some("ops-secret"), "PUT", "/admin/acl/bob-metrics", &rule);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/acl/bob-metrics", &rule);
    assert_eq!(r.status, 200, "replacing is 200: {}", r.text());
    // The config's rules cannot be changed through the API.
    admin_as(&b, Some(ADMIN_TOKEN), "DELETE", "/admin/acl/ops-admin", &Value::Null).assert_problem(409);
    admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/acl/x", &json!({"principal": "a"})).assert_problem(400);
    let r = admin_as(
        &b,
        Some(ADMIN_TOKEN),
        "PUT",
        "/admin/acl/x",
        &json!({"principal": "a", "resource": "queue:a", "actions": ["PUBLISH"], "effect": "ALLOW"}),
    );
    r.assert_problem(400);
    // In force on both shards without a restart: every connection is allowed now.
    let allowed_everywhere = |b: &TestBroker| {
        (0..8).all(|i| publish_as(&mut b.client(), Some("bob-secret"), "metrics.cpu", &format!("a{i}")).status == 202)
    };
    assert!(allowed_everywhere(&b));
    let list = admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/acl", &Value::Null).json();
    let ids: Vec<&str> = list.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids[0], "alice-publishes-orders", "highest priority first: {ids:?}");
    assert!(ids.contains(&"bob-metrics"));
    let one = admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/acl/bob-metrics", &Value::Null).json();
    assert_eq!((one["source"].as_str(), one["priority"].as_i64()), (Some("api"), Some(5)));
    // A DENY at the same priority wins the tie.
    let deny = json!({"principal": "b*", "resource": "topic:metrics.cpu", "actions": ["PUBLISH"], "effect": "DENY", "priority": 5});
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/acl/deny-cpu", &deny).status, 201);
    assert!(denied_everywhere(&b));
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "DELETE", "/admin/acl/deny-cpu", &Value::Null).status, 200);
    admin_as(&b, Some(ADMIN_TOKEN), "DELETE", "/admin/acl/deny-cpu", &Value::Null).assert_problem(404);
    // Persisted: a restart keeps the API's rules.
    b.restart();
    assert!(allowed_everywhere(&b));
    // A session whose permission is revoked is closed with 1008 and a reason.
    let sub = json!({"subscription": "billing-live", "topic": "orders.eu", "mode": "BROADCAST"});
    let r = post_as(&mut b.client(), "bob-secret", "/events/subscribe", &sub);
    assert_eq!(r.status, 201, "{}", r.text());
    let stream = TcpStream::connect(b.traffic).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let url = format!("ws://{}/events/ws?subscription=billing-live&ack=none&access_token=bob-secret", b.traffic);
    let (mut ws, _) = tungstenite::client(url, stream).unwrap();
    ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let deny = json!({"principal": "bob", "resource": "subscription:billing-live", "actions": ["SUBSCRIBE"], "effect": "DENY", "priority": 100});
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/acl/revoke", &deny).status, 201);
    let (code, _) = read_until_closed(&mut ws, Duration::from_secs(10));
    assert_eq!(code, Some(CloseCode::Policy));
}

#[test]
fn admin_api_without_auth_is_open_on_loopback_and_locked_by_an_admin_token() {
    // auth = none, loopback, no admin token: the admin API works (the tests' default).
    let b = TestBroker::start(&[]);
    let r = admin_as(&b, None, "PUT", "/admin/topics/t1", &json!({"partitions": 1}));
    assert_eq!(r.status, 201, "{}", r.text());
    drop(b);
    // An admin token locks the admin API, reads included, but not health, readiness or metrics.
    let b = TestBroker::start(&["--admin-token", ADMIN_TOKEN]);
    admin_as(&b, None, "PUT", "/admin/topics/t1", &json!({"partitions": 1})).assert_problem(401);
    admin_as(&b, None, "GET", "/admin/topics", &Value::Null).assert_problem(401);
    admin_as(&b, Some("wrong-token-0123456789"), "GET", "/admin/topics", &Value::Null).assert_problem(401);
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/topics/t1", &json!({"partitions": 1})).status, 201);
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(b.admin().get(open).status, 200, "{open}");
    }
    // Traffic stays open (auth = none).
    assert_eq!(b.publish("t1", &event("x")).status, 202);
    drop(b);
    // auth on, but neither an admin token nor a rule granting ADMIN: open on loopback.
    let dir = files("admin-neither");
    let tokens = dir.join("t.jsonl");
    std::fs::write(&tokens, "").unwrap();
    let b = TestBroker::start(&["--auth", "token", "--auth-tokens-file", tokens.to_str().unwrap()]);
    assert_eq!(admin_as(&b, None, "PUT", "/admin/topics/t2", &json!({"partitions": 1})).status, 201);
    assert_eq!(admin_as(&b, None, "GET", "/admin/acl", &Value::Null).status, 200);
}

#[test]
fn failed_authentications_are_throttled_per_address() {
    // One shard: each shard counts the failures it saw.
    let (b, _dir) = token_broker("throttle", &["--shards", "1"]);
    // A keep-alive publisher that proved its token before the flood (same address).
    let mut verified = b.client();
    assert_eq!(publish_as(&mut verified, Some("alice-secret"), "orders.eu", "v0").status, 202);
    let mut statuses = Vec::new();
    for i in 0..30 {
        // New connections: the count is per address, not per connection.
        let r = publish_as(&mut b.client(), Some(&format!("guess-{i}")), "orders.eu", "x");
        statuses.push(r.status);
        if r.status == 429 {
            assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
            r.assert_problem(429);
        }
    }
    let first = statuses.iter().position(|&s| s == 429).expect("throttled");
    assert!(statuses[..first].iter().all(|&s| s == 401), "{statuses:?}");
    assert!(statuses[first..].iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(first, 20, "throttled after 20 failures: {statuses:?}");
    // A valid token from that address on a new connection is throttled too (until the window
    // ends), but the connection that had proved its token goes on: one bad client behind a NAT
    // does not shut out the others.
    publish_as(&mut b.client(), Some("alice-secret"), "orders.eu", "x").assert_problem(429);
    assert_eq!(publish_as(&mut verified, Some("alice-secret"), "orders.eu", "v1").status, 202);
}

#[test]
fn two_tenants_using_the_same_names_never_see_each_others_events() {
    let tokens = [
        ("svc-acme", Some("acme"), "acme-secret"),
        ("svc-globex", Some("globex"), "globex-secret"),
        ("ops-acme", Some("acme"), "acme-ops-secret"),
    ];
    let acl = format!(
        r#"{SERVICES_ACL}
[[acl]]
id = "tenant-ops"
principal = "ops-*"
resource = "admin"
actions = ["ADMIN"]
effect = "ALLOW"
"#
    );
    let (b, _dir) = broker_with("tenants", &tokens, &acl, &[]);
    // The same subscription and topic names in both tenants: two subscriptions, two topics.
    for who in ["acme-secret", "globex-secret"] {
        let sub = json!({"subscription": "billing", "topic": "orders", "mode": "LOAD_BALANCE", "start": "earliest"});
        let r = post_as(&mut b.client(), who, "/events/subscribe", &sub);
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["topic"], "orders", "answered with the tenant's own names");
    }
    for i in 0..3 {
        assert_eq!(publish_as(&mut b.client(), Some("acme-secret"), "orders", &format!("acme-{i}")).status, 202);
        assert_eq!(publish_as(&mut b.client(), Some("globex-secret"), "orders", &format!("globex-{i}")).status, 202);
    }
    for (who, tenant) in [("acme-secret", "acme"), ("globex-secret", "globex")] {
        let mut got = Vec::new();
        while got.len() < 3 {
            let r = b.client().request(
                "GET",
                "/events/poll?subscription=billing&max=10&waitMs=2000",
                &[("authorization", &bearer(who))],
                b"",
            );
            assert_eq!(r.status, 200, "{}", r.text());
            got.extend(r.json().as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_owned()));
        }
        assert!(got.iter().all(|id| id.starts_with(tenant)), "{tenant} got {got:?}");
        // Nothing more: the other tenant's events are not in this subscription.
        let r = b.client().request(
            "GET",
            "/events/poll?subscription=billing&max=10&waitMs=300",
            &[("authorization", &bearer(who))],
            b"",
        );
        assert_eq!(r.status, 204, "{tenant}: {}", r.text());
    }
    // acme's administrator sees acme's topic under its own name, and nothing of globex's.
    let topics = admin_as(&b, Some("acme-ops-secret"), "GET", "/admin/topics", &Value::Null).json();
    let names: Vec<&str> = topics.as_array().unwrap().iter().map(|t| t["topic"].as_str().unwrap()).collect();
    assert!(names.contains(&"orders") && names.iter().all(|n| !n.contains("globex")), "{names:?}");
    let subs = admin_as(&b, Some("acme-ops-secret"), "GET", "/admin/subscriptions", &Value::Null).json();
    assert_eq!(subs.as_array().unwrap().len(), 1, "{subs}");
    assert_eq!(subs[0]["subscription"], "billing");
    let mut stored = Vec::new();
    for p in 0..2 {
        let path = format!("/admin/topics/orders/partitions/{p}/events?from=0&max=100");
        let r = admin_as(&b, Some("acme-ops-secret"), "GET", &path, &Value::Null);
        assert_eq!(r.status, 200, "{}", r.text());
        stored.extend(r.json().as_array().unwrap().iter().map(|e| e["event"]["id"].as_str().unwrap().to_owned()));
    }
    stored.sort();
    assert_eq!(stored, ["acme-0", "acme-1", "acme-2"]);
    // ... and may not change the ACL, which governs every tenant.
    admin_as(&b, Some("acme-ops-secret"), "GET", "/admin/acl", &Value::Null).assert_problem(403);
    // The operator (admin token, no tenant) sees both namespaces.
    let all = admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/topics", &Value::Null).text();
    assert!(all.contains("acme.orders") && all.contains("globex.orders"), "{all}");
}

#[test]
fn evmesh_pub_and_sub_take_a_token() {
    let (b, _dir) = token_broker("cli", &[]);
    let url = format!("http://{}", b.traffic);
    let cli = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_evmesh")).args(args).output().unwrap();
    let publish = ["pub", "--url", &url, "--topic", "orders.cli", "--type", "t", "--data", "1"];
    let out = cli(&publish);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stdout).contains("401"), "{out:?}");
    let out = cli(&[&publish[..], &["--token", "alice-secret"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sub = json!({"subscription": "billing-cli", "topic": "orders.cli", "mode": "BROADCAST", "start": "earliest"});
    let r = post_as(&mut b.client(), "bob-secret", "/events/subscribe", &sub);
    assert_eq!(r.status, 201, "{}", r.text());
    let out = cli(&["sub", "--url", &url, "--subscription", "billing-cli", "--client-id", "c", "--max", "1"]);
    assert!(!out.status.success(), "attached without a token");
    let out = cli(&[
        "sub",
        "--url",
        &url,
        "--subscription",
        "billing-cli",
        "--client-id",
        "c",
        "--max",
        "1",
        "--token",
        "bob-secret",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn a_session_ends_when_its_token_is_removed_from_the_tokens_file() {
    let (b, dir) = token_broker("revoke-token", &[]);
    let sub = json!({"subscription": "billing-rt", "topic": "orders.eu", "mode": "BROADCAST"});
    let r = post_as(&mut b.client(), "bob-secret", "/events/subscribe", &sub);
    assert_eq!(r.status, 201, "{}", r.text());
    let mut ws = ws_as(&b, "/events/ws?subscription=billing-rt&ack=none", "bob-secret");
    // bob's line goes; alice's stays. The file is replaced by a rename, as an operator would.
    let line = json!({"principal": "alice", "sha256": sha256_hex("alice-secret")});
    std::fs::write(dir.join("tokens.new"), format!("{line}\n")).unwrap();
    std::fs::rename(dir.join("tokens.new"), dir.join("tokens.jsonl")).unwrap();
    let start = std::time::Instant::now();
    let close = loop {
        assert!(start.elapsed() < Duration::from_secs(10), "the session outlived its token");
        match ws.read() {
            Ok(tungstenite::Message::Close(f)) => break f,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.to_string().contains("Resource temporarily unavailable") => {}
            Err(e) => panic!("{e}"),
        }
    };
    let f = close.expect("a close frame");
    assert_eq!((f.code, f.reason.as_str()), (CloseCode::Policy, "token revoked"));
    // And the token no longer opens anything.
    publish_as(&mut b.client(), Some("bob-secret"), "orders.eu", "x").assert_problem(401);
}

#[test]
fn rate_limits_per_principal_and_per_topic_answer_429_with_retry_after() {
    let (b, _dir) = token_broker("limits", &[]);
    let put = |id: &str, body: Value| admin_as(&b, Some(ADMIN_TOKEN), "PUT", &format!("/admin/limits/{id}"), &body);
    // Refused shapes first.
    put("bad", json!({"scope": "user:x", "eventsPerSecond": 1})).assert_problem(400);
    put("bad", json!({"scope": "principal:alice"})).assert_problem(400);
    put("bad", json!({"scope": "principal:alice", "eventsPerSecond": 0})).assert_problem(400);
    admin_as(
        &b,
        Some("bob-secret"),
        "PUT",
        "/admin/limits/x",
        &json!({"scope": "principal:bob", "eventsPerSecond": 1}),
    )
    .assert_problem(403);
    // alice: 5 events a second, a burst of 5, on one keep-alive connection.
    let r = put("alice", json!({"scope": "principal:alice", "eventsPerSecond": 5, "burst": 5}));
    assert_eq!(r.status, 201, "{}", r.text());
    let mut c = b.client();
    let statuses: Vec<u16> =
        (0..8).map(|i| publish_as(&mut c, Some("alice-secret"), "orders.eu", &format!("l{i}")).status).collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 5, "{statuses:?}");
    let r = publish_as(&mut c, Some("alice-secret"), "orders.eu", "over");
    r.assert_problem(429);
    assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    assert!(r.json()["detail"].as_str().unwrap().contains("principal:alice"));
    // Listed, then replaced by a higher limit: in force at once, on every shard.
    let list = admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/limits", &Value::Null).json();
    assert_eq!(list[0]["id"], "alice");
    assert_eq!(list[0]["eventsPerSecond"], 5);
    assert_eq!(put("alice", json!({"scope": "principal:alice", "eventsPerSecond": 100000})).status, 200);
    for i in 0..20 {
        assert_eq!(publish_as(&mut b.client(), Some("alice-secret"), "orders.eu", &format!("m{i}")).status, 202);
    }
    // A topic limit, in bytes: 100 bytes a second on orders.slow (an event here is about 90), others unaffected.
    assert_eq!(put("slow", json!({"scope": "topic:orders.slow", "bytesPerSecond": 100, "burst": 100})).status, 201);
    assert_eq!(publish_as(&mut c, Some("alice-secret"), "orders.slow", "s0").status, 202);
    publish_as(&mut c, Some("alice-secret"), "orders.slow", "s1").assert_problem(429);
    assert_eq!(publish_as(&mut c, Some("alice-secret"), "orders.fast", "f0").status, 202);
    // Removed: no limit any more. And limits are stored: they survive a restart.
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "DELETE", "/admin/limits/slow", &Value::Null).status, 200);
    admin_as(&b, Some(ADMIN_TOKEN), "DELETE", "/admin/limits/slow", &Value::Null).assert_problem(404);
    let mut b = b;
    b.restart();
    let one = admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/limits/alice", &Value::Null).json();
    assert_eq!(one["eventsPerSecond"], 100000);
    admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/limits/slow", &Value::Null).assert_problem(404);
}

/// Principals `svc-*` may publish and subscribe to every topic, and subscribe with any name.
const SERVICES_ACL: &str = r#"
[[acl]]
id = "services"
principal = "svc-*"
resource = "topic:*"
actions = ["PUBLISH", "SUBSCRIBE"]
effect = "ALLOW"

[[acl]]
id = "services-subscriptions"
principal = "svc-*"
resource = "subscription:*"
actions = ["SUBSCRIBE"]
effect = "ALLOW"
"#;

#[test]
fn a_tenant_quota_caps_its_topics_and_subscriptions() {
    let tokens = [("svc-acme", Some("acme"), "acme-secret"), ("svc-globex", Some("globex"), "globex-secret")];
    let (b, _dir) = broker_with("quotas", &tokens, SERVICES_ACL, &[]);
    let q = json!({"topics": 2, "subscriptions": 1});
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/quotas/acme", &q).status, 201);
    // (An administrator of acme would be held to it too: PUT /admin/topics counts the same.)
    admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/quotas/a.b", &q).assert_problem(400);
    admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/quotas/acme", &json!({"topicz": 1})).assert_problem(400);
    let mut c = b.client();
    assert_eq!(publish_as(&mut c, Some("acme-secret"), "t1", "a").status, 202);
    assert_eq!(publish_as(&mut c, Some("acme-secret"), "t2", "b").status, 202);
    let r = publish_as(&mut c, Some("acme-secret"), "t3", "c");
    r.assert_problem(429);
    assert!(r.header("retry-after").is_some() && r.text().contains("quota of 2 topics"), "{}", r.text());
    // Existing topics take more events; another tenant is not counted against acme.
    assert_eq!(publish_as(&mut c, Some("acme-secret"), "t1", "d").status, 202);
    for t in ["t1", "t2", "t3"] {
        assert_eq!(publish_as(&mut c, Some("globex-secret"), t, "g").status, 202);
    }
    let sub = |who: &str, name: &str| {
        let body = json!({"subscription": name, "topic": "t1"});
        post_as(&mut b.client(), who, "/events/subscribe", &body)
    };
    assert_eq!(sub("acme-secret", "s1").status, 201);
    assert_eq!(sub("acme-secret", "s1").status, 200, "the same definition again is not a new one");
    sub("acme-secret", "s2").assert_problem(429);
    // Raised: in force at once.
    let q = json!({"topics": 3, "subscriptions": 2});
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/quotas/acme", &q).status, 200);
    assert_eq!(publish_as(&mut c, Some("acme-secret"), "t3", "c").status, 202);
    assert_eq!(sub("acme-secret", "s2").status, 201);
    let listed = admin_as(&b, Some(ADMIN_TOKEN), "GET", "/admin/quotas", &Value::Null).json();
    assert_eq!(listed[0]["tenant"], "acme");
    assert_eq!(listed[0]["topics"], 3);
}

#[test]
fn a_tenant_connections_quota_counts_open_connections_and_sessions_and_shows_in_metrics() {
    let tokens = [("svc-acme", Some("acme"), "acme-secret")];
    let (b, _dir) = broker_with("conn-quota", &tokens, SERVICES_ACL, &[]);
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/quotas/acme", &json!({"connections": 2})).status, 201);
    // Two open: a keep-alive client and a WebSocket session (counted as long as it lives).
    let mut first = b.client();
    let sub = json!({"subscription": "live", "topic": "t", "mode": "BROADCAST"});
    let r = post_as(&mut first, "acme-secret", "/events/subscribe", &sub);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(publish_as(&mut first, Some("acme-secret"), "t", "a").status, 202);
    let stream = TcpStream::connect(b.traffic).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let url = format!("ws://{}/events/ws?subscription=live&ack=none&access_token=acme-secret", b.traffic);
    let (mut ws, _) = tungstenite::client(url, stream).unwrap();
    ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let r = publish_as(&mut b.client(), Some("acme-secret"), "t", "b");
    r.assert_problem(429);
    assert!(r.text().contains("quota of 2 connections"), "{}", r.text());
    // The open ones go on; once the session ends, a new connection gets in.
    assert_eq!(publish_as(&mut first, Some("acme-secret"), "t", "c").status, 202);
    ws.close(None).unwrap();
    let _ = read_until_closed(&mut ws, Duration::from_secs(5));
    drop(ws);
    wait_for(Duration::from_secs(10), || {
        (publish_as(&mut b.client(), Some("acme-secret"), "t", "d").status == 202).then_some(())
    });
    let metrics = b.admin().get("/metrics").text();
    let line =
        |name: &str| metrics.lines().find(|l| l.starts_with(&format!("{name}{{tenant=\"acme\"}}"))).map(str::to_owned);
    let published: u64 =
        line("evmesh_tenant_events_published_total").unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(published >= 3, "{metrics}");
    let limited: u64 = line("evmesh_tenant_limited_total").unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(limited >= 1, "{metrics}");
    assert!(line("evmesh_tenant_connections").is_some(), "{metrics}");
}

#[test]
fn a_flood_of_denied_requests_cannot_grow_the_audit_log_past_its_bounds() {
    // Every line written, the file rotated at 4 KiB: at most two files of 4 KiB.
    let (b, dir) = token_broker("audit-bytes", &["--audit-max-bytes", "4096", "--audit-max-per-second", "1000000"]);
    let mut c = b.client();
    for i in 0..300 {
        publish_as(&mut c, Some("alice-secret"), "payments", &format!("x{i}")).assert_problem(403);
    }
    let rotated = dir.join("audit.log.1");
    wait_for(Duration::from_secs(10), || rotated.exists().then_some(()));
    // Let the writer drain what is queued, then measure.
    wait_for(Duration::from_secs(10), || {
        let l = audit_lines(&dir);
        l.last().is_some_and(|l| l["resource"] == "topic:payments").then_some(())
    });
    for f in ["audit.log", "audit.log.1"] {
        let len = std::fs::metadata(dir.join(f)).unwrap().len();
        assert!(len <= 4096, "{f} is {len} bytes");
    }
    drop(b);
    // At 5 lines a second, a flood is summed up instead of written line by line.
    let (b, dir) = token_broker("audit-rate", &["--audit-max-per-second", "5"]);
    let mut c = b.client();
    for i in 0..200 {
        publish_as(&mut c, Some("alice-secret"), "payments", &format!("y{i}")).assert_problem(403);
    }
    let lines = wait_for(Duration::from_secs(10), || {
        let l = audit_lines(&dir);
        l.iter().any(|l| l["suppressed"].as_u64().is_some()).then_some(l)
    });
    let denied = lines.iter().filter(|l| l["outcome"] == "denied").count();
    let suppressed: u64 = lines.iter().filter_map(|l| l["suppressed"].as_u64()).sum();
    assert!(denied < 50, "{denied} lines written at 5 a second");
    assert!(suppressed >= 100, "{suppressed} suppressed");
}

#[test]
fn oversized_and_malformed_credentials_are_refused_cheaply() {
    let (b, _dir) = token_broker("bad-credentials", &[]);
    let mut c = b.client();
    // A 15 KiB token (the head limit is 16 KiB), and JWT-shaped garbage: 401 each, the
    // connection kept (a bad credential is not a framing error).
    let huge = "a".repeat(15 * 1024);
    for token in [huge.as_str(), "e30.e30.", "!!!.???.***", "eyJhbGciOiJub25lIn0.e30.", "Bearer"] {
        let r = publish_as(&mut c, Some(token), "orders.eu", "x");
        r.assert_problem(401);
        assert!(r.text().len() < 1024, "the answer does not echo the credential: {} bytes", r.text().len());
    }
    // Another scheme is no credential at all.
    let r = c.request(
        "POST",
        "/events/publish?topic=orders.eu",
        &[("content-type", "application/cloudevents+json"), ("authorization", "Basic YWxpY2U6c2VjcmV0")],
        event("b").to_string().as_bytes(),
    );
    r.assert_problem(401);
    assert_eq!(publish_as(&mut c, Some("alice-secret"), "orders.eu", "ok").status, 202);
}

#[test]
fn a_tokens_file_that_no_longer_parses_leaves_the_old_keys_in_force() {
    let (b, dir) = token_broker("bad-reload", &[]);
    let metric = |b: &TestBroker, name: &str| -> u64 {
        let text = b.admin().get("/metrics").text();
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let replace = |text: String| {
        std::fs::write(dir.join("tokens.new"), text).unwrap();
        std::fs::rename(dir.join("tokens.new"), dir.join("tokens.jsonl")).unwrap();
    };
    replace("{\"principal\": \"alice\", \"sha256\": \"not hex\"}\n".into());
    wait_for(Duration::from_secs(10), || (metric(&b, "evmesh_auth_key_reloads_failed_total") == 1).then_some(()));
    assert_eq!(publish_as(&mut b.client(), Some("alice-secret"), "orders.eu", "still").status, 202);
    // Fixed (and carol added): in force, and the old tokens that are gone no longer work.
    let carol = json!({"principal": "alice", "sha256": sha256_hex("carol-secret")});
    replace(format!("{carol}\n"));
    wait_for(Duration::from_secs(10), || (metric(&b, "evmesh_auth_key_reloads_total") == 1).then_some(()));
    assert_eq!(publish_as(&mut b.client(), Some("carol-secret"), "orders.eu", "new").status, 202);
    publish_as(&mut b.client(), Some("alice-secret"), "orders.eu", "old").assert_problem(401);
}

/// `backlogBytes`: once what a tenant's subscriptions have not acknowledged reaches the quota,
/// its producers get 429 with `Retry-After` (and the gauge shows the backlog); once consumers
/// ack, publishing goes on. Another tenant is not held back.
#[test]
fn a_tenant_backlog_quota_holds_producers_until_consumers_catch_up() {
    let tokens = [("svc-acme", Some("acme"), "acme-secret"), ("svc-globex", Some("globex"), "globex-secret")];
    let (b, _dir) = broker_with("backlog", &tokens, SERVICES_ACL, &["--default-partitions", "1"]);
    let q = json!({"backlogBytes": 8000});
    assert_eq!(admin_as(&b, Some(ADMIN_TOKEN), "PUT", "/admin/quotas/acme", &q).status, 201);
    let body = json!({"subscription": "work", "topic": "jobs", "start": "earliest"});
    assert_eq!(post_as(&mut b.client(), "acme-secret", "/events/subscribe", &body).status, 201);
    let mut c = b.client();
    // Each stored event is a few hundred bytes: 40 are well over 8000.
    for i in 0..40 {
        assert_eq!(publish_as(&mut c, Some("acme-secret"), "jobs", &format!("j{i}")).status, 202);
    }
    let refused = wait_for(Duration::from_secs(10), || {
        let r = publish_as(&mut c, Some("acme-secret"), "jobs", "more");
        (r.status == 429).then_some(r)
    });
    refused.assert_problem(429);
    assert_eq!(refused.header("retry-after"), Some("2"));
    assert!(refused.text().contains("backlogBytes"), "{}", refused.text());
    let metrics = b.admin().get("/metrics").text();
    let gauge: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("evmesh_tenant_backlog_bytes{tenant=\"acme\"} "))
        .expect("the backlog gauge")
        .parse()
        .unwrap();
    assert!(gauge >= 8000, "{gauge}");
    assert_eq!(publish_as(&mut c, Some("globex-secret"), "jobs", "g").status, 202, "globex has no backlog quota");
    // The consumer takes and acks everything: producers go on.
    let auth = bearer("acme-secret");
    loop {
        let r = c.request("GET", "/events/poll?subscription=work&max=100&waitMs=500", &[("authorization", &auth)], b"");
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        let batch: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
        let ids: Vec<&Value> = batch.iter().map(|e| &e["emdeliveryid"]).collect();
        let ack = json!({"subscription": "work", "ids": ids});
        assert_eq!(post_as(&mut c, "acme-secret", "/events/ack", &ack).status, 200);
    }
    wait_for(Duration::from_secs(10), || {
        (publish_as(&mut c, Some("acme-secret"), "jobs", "after").status == 202).then_some(())
    });
}

#[test]
fn requests_need_request_replies_need_reply_and_another_tenant_gets_404() {
    let tokens = [
        ("client", None, "client-secret"),
        ("pubonly", None, "pubonly-secret"),
        ("responder", None, "responder-secret"),
        ("norep", None, "norep-secret"),
        ("stranger", Some("globex"), "stranger-secret"),
    ];
    let acl = [
        rule("client-requests", "client", "topic:rpc", "REQUEST"),
        rule("pubonly-publishes", "pubonly", "topic:rpc", "PUBLISH"),
        rule("responder-replies", "responder", "topic:rpc", "REPLY"),
        rule("stranger-replies", "stranger", "topic:rpc", "REPLY"),
    ]
    .concat();
    let (b, dir) = broker_with("request-acl", &tokens, &acl, &[]);
    let ev = event("q").to_string();
    let ask = |token: &str| {
        let headers = vec![
            ("content-type".to_string(), "application/cloudevents+json".to_string()),
            ("authorization".into(), bearer(token)),
        ];
        super::request::request_async(&b, "rpc", 10_000, headers, ev.clone().into_bytes())
    };
    // PUBLISH is not REQUEST.
    let refused = ask("pubonly-secret").join().unwrap().0.expect("a response");
    refused.assert_problem(403);
    let waiting = ask("client-secret");
    let stored = wait_for(Duration::from_secs(5), || {
        (0..2).find_map(|p| {
            let path = format!("/admin/topics/rpc/partitions/{p}/events?from=0&max=10");
            let r = admin_as(&b, Some(ADMIN_TOKEN), "GET", &path, &Value::Null);
            r.json().as_array().and_then(|a| a.first().map(|e| e["event"].clone()))
        })
    });
    let mut reply = event("re-q");
    reply["emcorrelationid"] = stored["emcorrelationid"].clone();
    let reply_as = |token: &str| {
        let auth = bearer(token);
        let headers = [("content-type", "application/cloudevents+json"), ("authorization", auth.as_str())];
        b.client().request("POST", "/events/reply", &headers, reply.to_string().as_bytes())
    };
    // No REPLY on topic:rpc: 403, audited; another tenant's principal: 404, as for an unknown id.
    reply_as("norep-secret").assert_problem(403);
    reply_as("stranger-secret").assert_problem(404);
    assert_eq!(reply_as("responder-secret").status, 202);
    let r = waiting.join().unwrap().0.expect("a response");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "re-q");
    wait_for(Duration::from_secs(5), || {
        audit_lines(&dir)
            .iter()
            .any(|l| l["principal"] == "norep" && l["action"] == "REPLY" && l["outcome"] == "denied")
            .then_some(())
    });
}

#[test]
fn agent_calls_need_request_on_the_agent_agents_need_subscribe_and_tenants_are_apart() {
    let tokens = [
        ("client", None, "client-secret"),
        ("other", None, "other-secret"),
        ("bot", None, "bot-secret"),
        ("acme-client", Some("acme"), "acme-client-secret"),
        ("acme-bot", Some("acme"), "acme-bot-secret"),
    ];
    let acl = [
        rule("client-calls", "*client", "agent:bot", "REQUEST"),
        rule("other-calls", "other", "agent:bot", "REQUEST"),
        rule("bot-serves", "*bot", "topic:agent.bot", "SUBSCRIBE"),
    ]
    .concat();
    let (b, _dir) = broker_with("agent-acl", &tokens, &acl, &[]);
    let attach = |token: &str| {
        let r = post_as(&mut b.client(), token, "/agent/register", &json!({"agentId": "bot"}));
        assert_eq!(r.status, 201, "{}", r.text());
        let url = format!("ws://{}/agent/ws?agentId=bot&access_token={token}", b.traffic);
        let ws = tungstenite::client(url, TcpStream::connect(b.traffic).unwrap()).unwrap().0;
        super::calls::attached(&b, "bot", Some(token));
        ws
    };
    let mut bot = attach("bot-secret");
    let open =
        |token: &str| post_as(&mut b.client(), token, "/session/open", &json!({"clientId": "c", "agentId": "bot"}));
    b.client().post("/session/open", "application/json", br#"{"clientId":"c"}"#).assert_problem(401);
    // The agent itself may not call agents; a client may not send an agent's chunks.
    open("bot-secret").assert_problem(403);
    let r = open("client-secret");
    assert_eq!(r.status, 201, "{}", r.text());
    let sid = r.json()["sessionId"].as_str().unwrap().to_owned();
    post_as(&mut b.client(), "client-secret", &format!("/session/chunk/{sid}"), &json!({"data": "x"}))
        .assert_problem(403);
    // Another principal, allowed to call the agent, still may not use this session.
    assert_eq!(super::calls::Turn::post_as(&b, &sid, "hi", Some("other-secret")).err().map(|e| e.0), Some(403));
    // Another tenant: its own agent named bot is not this one, and the session is unknown to it.
    open("acme-client-secret").assert_problem(503);
    assert_eq!(super::calls::Turn::post_as(&b, &sid, "hi", Some("acme-client-secret")).err().map(|e| e.0), Some(404));
    let mut acme_bot = attach("acme-bot-secret");
    let r = open("acme-client-secret");
    assert_eq!(r.status, 201, "{}", r.text());
    let acme_sid = r.json()["sessionId"].as_str().unwrap().to_owned();
    let mut turn = super::calls::Turn::post_as(&b, &acme_sid, "for acme", Some("acme-client-secret")).unwrap();
    let next = |ws: &mut tungstenite::WebSocket<TcpStream>| loop {
        if let tungstenite::Message::Text(t) = ws.read().unwrap() {
            break serde_json::from_str::<Value>(t.as_str()).unwrap();
        }
    };
    assert_eq!(next(&mut acme_bot)["data"], "for acme");
    // The acme agent cannot answer the other tenant's session (unknown to it), only its own.
    let chunk = |sid: &str| {
        tungstenite::Message::text(json!({"type": "chunk", "sessionId": sid, "data": "x", "done": true}).to_string())
    };
    acme_bot.send(chunk(&sid)).unwrap();
    assert_eq!(next(&mut acme_bot)["status"], 404);
    acme_bot.send(chunk(&acme_sid)).unwrap();
    assert_eq!(turn.next().unwrap().1, "done");
    // The first tenant's bot got none of it: its next event is its own client's turn.
    let mut own = super::calls::Turn::post_as(&b, &sid, "for bot", Some("client-secret")).unwrap();
    assert_eq!(next(&mut bot)["data"], "for bot");
    bot.send(chunk(&sid)).unwrap();
    assert_eq!(own.next().unwrap().1, "done");
}

/// A follower session (`GET /session/subscribe/{sid}`) closes only when its credential expires;
/// its `publish` messages must still stop once the keys no longer verify the credential it was
/// opened with (found by review: they went on being published after the token was removed).
#[test]
fn a_sessions_publish_messages_are_refused_once_its_token_is_removed() {
    let tokens = [("svc-carol", None, "carol-secret"), ("svc-dave", None, "dave-secret")];
    let (b, dir) = broker_with("revoke-session-publish", &tokens, SERVICES_ACL, &[]);
    let mut ws = ws_as(&b, "/session/subscribe/s-1", "carol-secret");
    let mut publish = |id: &str| -> Value {
        let m = json!({"type": "publish", "topic": "orders.eu", "event": event(id)});
        ws.send(tungstenite::Message::text(m.to_string())).unwrap();
        wait_for(Duration::from_secs(10), || match ws.read() {
            Ok(tungstenite::Message::Text(t)) => Some(serde_json::from_str::<Value>(&t).unwrap()),
            _ => None,
        })
    };
    assert_eq!(publish("before")["type"], "published");
    // carol's line goes; dave's stays. The file is replaced by a rename, as an operator would.
    let line = json!({"principal": "svc-dave", "sha256": sha256_hex("dave-secret")});
    std::fs::write(dir.join("tokens.new"), format!("{line}\n")).unwrap();
    std::fs::rename(dir.join("tokens.new"), dir.join("tokens.jsonl")).unwrap();
    wait_for(Duration::from_secs(10), || {
        (publish_as(&mut b.client(), Some("carol-secret"), "orders.eu", "x").status == 401).then_some(())
    });
    let a = publish("after");
    assert_eq!((&a["type"], &a["status"], &a["id"]), (&json!("error"), &json!(401), &json!("after")), "{a}");
    let auth = bearer(ADMIN_TOKEN);
    let get = |path: &str| b.admin().request("GET", path, &[("authorization", &auth)], b"").json();
    // Every partition there may be (past the last, the admin API answers a problem, not a list).
    let ids: Vec<Value> = (0..16)
        .flat_map(|p| {
            get(&format!("/admin/topics/orders.eu/partitions/{p}/events?from=0&max=10"))
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|e| e["event"]["id"].clone())
        .filter(|id| id != "x")
        .collect();
    // ("x": the HTTP probe's publishes, stored until the new tokens file was read.)
    assert_eq!(ids, [json!("before")]);
}

/// A2A contexts and tasks are their callers': two principals naming the same `contextId` get
/// sessions of their own (the agent sees two), and neither reads, lists or continues the
/// other's task (regression: a context's session was found by its name alone).
#[test]
fn a2a_contexts_and_tasks_belong_to_their_caller() {
    let tokens = [("alice", None, "alice-secret"), ("bob", None, "bob-secret"), ("botp", None, "bot-secret")];
    let acl = r#"
[[acl]]
id = "alice-calls"
principal = "alice"
resource = "agent:bot"
actions = ["REQUEST"]
effect = "ALLOW"

[[acl]]
id = "bob-calls"
principal = "bob"
resource = "agent:bot"
actions = ["REQUEST"]
effect = "ALLOW"

[[acl]]
id = "bot-serves"
principal = "botp"
resource = "topic:agent.bot"
actions = ["SUBSCRIBE"]
effect = "ALLOW"
"#;
    let (b, _dir) = broker_with("a2a-owners", &tokens, acl, &[]);
    let auth = |t: &str| format!("Bearer {t}");
    let bot = auth("bot-secret");
    let r = b.client().request("POST", "/agent/register", &[("authorization", &bot)], br#"{"agentId":"bot"}"#);
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let stream = TcpStream::connect(b.traffic).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let url = format!("ws://{}/agent/ws?agentId=bot&access_token=bot-secret", b.traffic);
    let (mut ws, _) = tungstenite::client(url, stream).unwrap();
    super::calls::attached(&b, "bot", Some("bot-secret"));
    // The agent answers every turn at once, and says which session it came on.
    let agent = std::thread::spawn(move || {
        let mut sessions = Vec::new();
        while sessions.len() < 2 {
            let t = match ws.read() {
                Ok(tungstenite::Message::Text(t)) => t,
                Ok(_) => continue,
                Err(e) => panic!("the agent's socket: {e}"),
            };
            let turn: Value = serde_json::from_str(t.as_str()).unwrap();
            let sid = turn["emsessionid"].as_str().unwrap().to_owned();
            let chunk = json!({"type": "chunk", "sessionId": sid, "seq": 0, "data": sid, "done": true});
            ws.send(tungstenite::Message::text(chunk.to_string())).unwrap();
            sessions.push(sid);
        }
        sessions
    });
    let call = |token: &str, method: &str, params: Value| -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let who = auth(token);
        let headers = [("authorization", who.as_str()), ("a2a-version", "1.0")];
        b.client().request("POST", "/a2a/bot", &headers, body.as_bytes()).json()
    };
    let send = |token: &str| {
        let m = json!({"messageId": "m", "role": "ROLE_USER", "contextId": "shared", "parts": [{"text": "hi"}]});
        let v = call(token, "SendMessage", json!({"message": m}));
        assert_eq!(v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{v}");
        v["result"]["task"].clone()
    };
    let (a, bt) = (send("alice-secret"), send("bob-secret"));
    let sessions = agent.join().unwrap();
    assert_ne!(sessions[0], sessions[1], "one context name, two callers, two sessions");
    assert_eq!((a["contextId"].as_str(), bt["contextId"].as_str()), (Some("shared"), Some("shared")));
    let alices = a["id"].as_str().unwrap();
    assert_eq!(call("bob-secret", "GetTask", json!({"id": alices}))["error"]["code"], -32001);
    assert_eq!(call("bob-secret", "CancelTask", json!({"id": alices}))["error"]["code"], -32001);
    let listed = call("bob-secret", "ListTasks", json!({}));
    assert_eq!(listed["result"]["totalSize"], 1, "{listed}");
    assert_eq!(listed["result"]["tasks"][0]["id"], bt["id"]);
    // Without REQUEST on the agent: refused, the request's id answered, 403 kept over REST.
    let r = b.client().request(
        "POST",
        "/a2a/other",
        &[("authorization", "Bearer alice-secret"), ("a2a-version", "1.0")],
        br#"{"jsonrpc":"2.0","id":"q","method":"GetTask","params":{"id":"x"}}"#,
    );
    assert_eq!(
        (r.json()["id"].as_str(), r.json()["error"]["code"].as_i64()),
        (Some("q"), Some(-32603)),
        "{}",
        r.text()
    );
    let r = b.client().request(
        "GET",
        "/a2a/other/v1/tasks/x",
        &[("authorization", "Bearer alice-secret"), ("a2a-version", "1.0")],
        b"",
    );
    assert_eq!((r.status, r.json()["error"]["status"].as_str()), (403, Some("PERMISSION_DENIED")), "{}", r.text());
}
