//! Events built by the official CloudEvents SDKs (Python and JavaScript), in every content mode,
//! are accepted and read back faithfully; independent Python clients receive and ack them over
//! WebSocket, SSE and long-poll. The test command installs both SDKs; the scripts in
//! tests/interop assert on what they read back and exit non-zero on any difference.

use std::path::Path;
use std::process::Command;

use super::util::TestBroker;

fn run_script(program: &str, script: &str) {
    run_script_with(program, script, &[]);
}

/// [`run_script`] against a broker started with `extra` flags besides.
fn run_script_with(program: &str, script: &str, extra: &[&str]) {
    let flags: Vec<&str> = ["--redelivery-backoff-ms", "50"].iter().chain(extra).copied().collect();
    let b = TestBroker::start(&flags);
    run_on(&b, program, script);
}

/// Runs `script` against the running broker `b`.
fn run_on(b: &TestBroker, program: &str, script: &str) {
    // Resolved at run time: a test binary built in another checkout reads this one's scripts.
    let root =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
    let path = Path::new(&root).join("tests/interop").join(script);
    let out = Command::new(program)
        .arg(&path)
        .arg(b.traffic.to_string())
        .arg(b.admin.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (scripts/test.sh installs it): {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed:\n{text}");
    assert!(text.contains("all checks passed"), "{text}");
}

#[test]
#[ignore = "needs Python with the CloudEvents SDK (SDK_PYTHON; scripts/test.sh installs it)"]
fn python_sdk_events_round_trip() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_sdk.py");
}

/// Independent clients of delivery: Python `websockets`, `httpx-sse` and `httpx`.
#[test]
#[ignore = "needs Python with websockets, httpx and httpx-sse (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_websocket_sse_and_poll_clients_receive_and_ack() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_delivery.py");
}

#[test]
#[ignore = "needs Node with the CloudEvents SDK (NODE_PATH; scripts/test.sh installs it)"]
fn javascript_sdk_events_round_trip() {
    run_script("node", "node_sdk.js");
}

/// Tokens minted by PyJWT (HS256, RS256, ES256, EdDSA, from a JWKS PyJWT wrote) against
/// auth = jwt: every 401 path, the ACL's 403, an ADMIN principal, ?access_token= sessions closed
/// when their token expires, and key rotation by rewriting the JWKS file.
#[test]
#[ignore = "needs Python with PyJWT, cryptography, httpx and websockets (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_jwt_tokens_keys_and_rotation() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    let root =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
    let script = Path::new(&root).join("tests/interop/python_jwt.py");
    let dir = std::env::temp_dir().join(format!("evmesh-jwt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(&python).arg(&script).arg("keys").arg(&dir).output().expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config = dir.join("evmesh.toml");
    std::fs::write(
        &config,
        r#"
[[acl]]
id = "services-publish-orders"
principal = "svc-*"
resource = "topic:orders.*"
actions = ["PUBLISH", "SUBSCRIBE"]
effect = "ALLOW"

[[acl]]
id = "services-subscribe"
principal = "svc-*"
resource = "subscription:*"
actions = ["SUBSCRIBE"]
effect = "ALLOW"

[[acl]]
id = "ops-admin"
principal = "ops"
resource = "admin"
actions = ["ADMIN"]
effect = "ALLOW"
"#,
    )
    .unwrap();
    let jwks = dir.join("jwks.json");
    let b = TestBroker::start(&[
        "--config",
        config.to_str().unwrap(),
        "--auth",
        "jwt",
        "--jwt-jwks-file",
        jwks.to_str().unwrap(),
        "--jwt-audience",
        "evmesh",
        "--jwt-issuer",
        "https://issuer.test",
    ]);
    let out = Command::new(&python)
        .arg(&script)
        .arg("run")
        .arg(&dir)
        .arg(b.traffic.to_string())
        .arg(b.admin.to_string())
        .output()
        .expect("python");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("all checks passed"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// TLS against clients nobody here wrote: Python's `ssl` (ALPN, TLS 1.3 and 1.2, a wrong CA,
/// keep-alive publishing, mutual TLS) and `openssl s_client` (ALPN, verification, a request, and
/// a client certificate).
#[test]
#[ignore = "needs python3 and the openssl command line (scripts/test.sh checks both)"]
fn tls_with_python_ssl_and_openssl_s_client() {
    use super::tls::Pki;
    let dir = std::env::temp_dir().join(format!("evmesh-tls-interop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pki = Pki::new(&dir, "ca");
    let (cert, key) = pki.issue("server-a", "server");
    pki.issue("svc-ingest", "svc-ingest");
    let other = Pki::new(&dir.join("other"), "other-ca");
    std::fs::copy(other.dir.join("other-ca.pem"), dir.join("other-ca.pem")).unwrap();
    let (cert, key, ca) = (cert.to_str().unwrap(), key.to_str().unwrap(), dir.join("ca.pem"));
    let tls = TestBroker::start(&["--tls-cert", cert, "--tls-key", key]);
    let config = dir.join("evmesh.toml");
    std::fs::write(
        &config,
        "[[acl]]\nid = \"ingest\"\nprincipal = \"svc-ingest\"\nresource = \"topic:orders.*\"\nactions = [\"PUBLISH\"]\neffect = \"ALLOW\"\n",
    )
    .unwrap();
    std::fs::write(dir.join("tokens.jsonl"), "").unwrap();
    let mtls = TestBroker::start(&[
        "--config",
        config.to_str().unwrap(),
        "--auth",
        "token",
        "--auth-tokens-file",
        dir.join("tokens.jsonl").to_str().unwrap(),
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--tls-client-ca",
        ca.to_str().unwrap(),
    ]);
    let root =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
    let out = Command::new("python3")
        .arg(Path::new(&root).join("tests/interop/python_tls.py"))
        .args([dir.to_str().unwrap(), &tls.traffic.to_string(), &tls.admin.to_string(), &mtls.traffic.to_string()])
        .output()
        .expect("python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("all checks passed"), "python_tls.py:\n{text}");

    // openssl s_client: a request to the admin listener, then mutual TLS on the traffic one.
    let s_client = |addr: std::net::SocketAddr, extra: &[&str], request: &str| {
        use std::io::Write;
        let mut child = Command::new("openssl")
            .args(["s_client", "-connect", &addr.to_string(), "-servername", "localhost", "-alpn", "http/1.1"])
            .args(["-CAfile", ca.to_str().unwrap(), "-verify_return_error", "-ign_eof"])
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("openssl");
        child.stdin.take().unwrap().write_all(request.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let health = "GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
    let text = s_client(tls.admin, &[], health);
    assert!(text.contains("ALPN protocol: http/1.1"), "{text}");
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    assert!(text.contains("HTTP/1.1 200") && text.contains(r#"{"status":"ok"}"#), "{text}");
    let body = r#"{"specversion":"1.0","id":"s-client-1","source":"/openssl","type":"com.example.tls"}"#;
    let publish = format!(
        "POST /events/publish?topic=orders.ssl HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/cloudevents+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (c, k) = (dir.join("svc-ingest.pem"), dir.join("svc-ingest.key"));
    let text = s_client(mtls.traffic, &["-cert", c.to_str().unwrap(), "-key", k.to_str().unwrap()], &publish);
    assert!(text.contains("HTTP/1.1 202"), "a client certificate of the CA publishes:\n{text}");
    let text = s_client(mtls.traffic, &[], &publish);
    assert!(!text.contains("HTTP/1.1 2"), "without a certificate nothing is published:\n{text}");
}

/// Request-reply with independent clients: `httpx` requesters (events built by the CloudEvents
/// SDK, structured and binary), `websockets` and `httpx` responders.
#[test]
#[ignore = "needs Python with websockets, httpx and the CloudEvents SDK (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_request_reply_clients() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_request_reply.py");
}

/// Session pub/sub with independent clients: `httpx-sse` (EventSource ids and `Last-Event-ID`
/// resume) and `websockets` subscribers of events the CloudEvents SDK built.
#[test]
#[ignore = "needs Python with httpx, httpx-sse, websockets and the CloudEvents SDK (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_session_pubsub_clients() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_session.py");
}

/// Agent streaming calls with independent clients: `websockets` agents, `httpx` + `httpx-sse`
/// clients (turns, cancel, resume with `Last-Event-ID`, an agent leaving mid-turn, expiry).
#[test]
#[ignore = "needs Python with httpx, httpx-sse and websockets (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_agent_streaming_clients() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script_with(&python, "python_agent_stream.py", &["--session-ttl-ms", "1500"]);
}

/// A turn read by the WHATWG `EventSource` (npm `eventsource`): named events, `lastEventId`, the
/// reconnect after the stream ends stopped by the 204; a cancel while it reads. The agent is
/// `evmesh agent`.
#[test]
#[ignore = "needs Node with the eventsource package (NODE_PATH; scripts/test.sh installs it)"]
fn javascript_eventsource_reads_a_turn_and_stops_reconnecting() {
    let b = TestBroker::start(&[]);
    let mut agent = Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["agent", "--url", &format!("http://{}", b.traffic), "--agent-id", "js-echo", "--delay-ms", "20"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    run_on(&b, "node", "node_eventsource.js");
    let _ = agent.kill();
    let _ = agent.wait();
}
