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
    run_on_with_env(b, program, script, &[]);
}

/// [`run_on`] with `env` set for the script.
fn run_on_with_env(b: &TestBroker, program: &str, script: &str, env: &[(&str, &str)]) {
    // Resolved at run time: a test binary built in another checkout reads this one's scripts.
    let root =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
    let path = Path::new(&root).join("tests/interop").join(script);
    let out = Command::new(program)
        .arg(&path)
        .arg(b.traffic.to_string())
        .arg(b.admin.to_string())
        .envs(env.iter().copied())
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

/// The Python SDK 1.x through `requests`: binary-mode attributes sent unencoded, non-ASCII as
/// ISO-8859-1 bytes (issue 12). The test command installs it apart from SDK 2.x (same package
/// name) and names the directory in `SDK1_PYTHONPATH`.
#[test]
#[ignore = "needs Python with the CloudEvents SDK 1.x and requests (SDK1_PYTHONPATH; scripts/test.sh installs them)"]
fn python_sdk_1x_events_round_trip() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    let path = std::env::var("SDK1_PYTHONPATH").expect("SDK1_PYTHONPATH names the SDK 1.x directory");
    let b = TestBroker::start(&[]);
    run_on_with_env(&b, &python, "python_sdk1.py", &[("PYTHONPATH", &path)]);
}

/// WebSocket publishers written with Python `websockets`: a pipelined `?publish=T` session and a
/// `publish` message on a delivery session (issue 12).
#[test]
#[ignore = "needs Python with websockets and the CloudEvents SDK (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_websocket_publishers() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_ws_publish.py");
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

/// The A2A 1.0 gateway driven by the official Python SDK (`a2a-sdk` 1.3.0) as client, an evmesh
/// agent (a `websockets` client) behind it: the card, blocking and streaming sends, a task
/// waiting for input, get, list, cancel, the errors, the version check and the REST binding.
#[test]
#[ignore = "needs Python with a2a-sdk, httpx and websockets (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_a2a_sdk_client_through_the_gateway() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_a2a.py");
}

/// A remote A2A server built with the official Python SDK (`a2a-sdk` 1.3.0, served by uvicorn)
/// registered by URL and called through evmesh with the same SDK as client: the card with
/// evmesh's URL, blocking and streaming sends relayed, cancel, an unknown task.
#[test]
#[ignore = "needs Python with a2a-sdk, uvicorn, httpx and websockets (SDK_PYTHON; scripts/test.sh installs them)"]
fn python_a2a_remote_agent_through_the_gateway() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    run_script(&python, "python_a2a_remote.py");
}

/// The same through the official JavaScript SDK (`@a2a-js/sdk` 1.3.0): JSON-RPC and REST
/// transports, streaming, input-required, the typed errors.
#[test]
#[ignore = "needs Node with @a2a-js/sdk and ws (NODE_PATH; scripts/test.sh installs them)"]
fn node_a2a_sdk_client_through_the_gateway() {
    run_script("node", "node_a2a.js");
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

/// Headers and body as the Rust SDK's HTTP serializer writes them.
#[derive(Default)]
struct SdkWire(Vec<(String, String)>);

type Written = (Vec<(String, String)>, Vec<u8>);

impl cloudevents::binding::http::Builder<Written> for SdkWire {
    fn header(&mut self, key: &str, value: http::header::HeaderValue) {
        let value = String::from_utf8(value.as_bytes().to_vec()).expect("the SDK writes UTF-8 headers");
        self.0.push((key.to_owned(), value));
    }

    fn body(&mut self, bytes: Vec<u8>) -> cloudevents::message::Result<Written> {
        Ok((std::mem::take(&mut self.0), bytes))
    }

    fn finish(&mut self) -> cloudevents::message::Result<Written> {
        self.body(Vec::new())
    }
}

/// Events built by the official Rust SDK (crate `cloudevents-sdk`), in binary, structured and
/// batched mode, are stored so that the SDK reads each back as the event it sent. Its binary
/// mode writes attribute values unencoded (UTF-8 bytes, a bare `%`), as the Python SDK 1.x does.
#[test]
fn rust_sdk_events_round_trip() {
    use cloudevents::binding::http::Serializer;
    use cloudevents::message::{BinaryDeserializer, StructuredDeserializer};
    use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};

    let b = TestBroker::start(&[]);
    let mut c = b.client();
    let base = |id: &str| {
        EventBuilderV10::new().id(id).source("/sdk/rust").ty("com.example.rust").time("2026-12-02T10:00:00.123456Z")
    };
    let binary_events = [
        base("json")
            .subject("s 1 é% and %zz")
            .extension("region", "eu-wést")
            .data("application/json", serde_json::json!({"sku": "A-1", "note": "ünïcode"}))
            .build()
            .unwrap(),
        base("bytes")
            .extension("partitionkey", "k-1")
            .data("application/octet-stream", vec![0u8, 1, 255])
            .build()
            .unwrap(),
        base("text").data("text/plain", "plain \"text\" 100%").build().unwrap(),
        base("nodata").subject("no data").build().unwrap(),
    ];
    let mut structured_events = binary_events.to_vec();
    structured_events.push(base("typed").extension("amount", 120i64).extension("vip", true).build().unwrap());

    let mut check = |mode: &str, event: &Event, (headers, body): Written| {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let r = c.request("POST", "/events/publish?topic=sdk-rust", &headers, &body);
        assert_eq!(r.status, 202, "{mode} {}: {}", event.id(), r.text());
        let (p, o) = (r.json()["partition"].as_u64().unwrap() as u32, r.json()["offset"].as_u64().unwrap());
        let stored = b.events("sdk-rust", p).into_iter().find(|(at, _)| *at == o).expect("stored").1;
        let back: Event = serde_json::from_value(stored.clone()).expect("the SDK reads the stored event");
        assert_eq!(&back, event, "{mode}: stored {stored}");
    };
    for e in &binary_events {
        check("binary", e, e.clone().deserialize_binary(Serializer::new(SdkWire::default())).unwrap());
    }
    for e in &structured_events {
        check("structured", e, e.clone().deserialize_structured(Serializer::new(SdkWire::default())).unwrap());
    }
    // A batch: the SDK's JSON format of each event, in one array.
    let body = serde_json::to_vec(&structured_events).unwrap();
    let r = c.post("/events/publish?topic=sdk-rust", "application/cloudevents-batch+json", &body);
    assert_eq!(r.status, 202, "{}", r.text());
    for (e, placed) in structured_events.iter().zip(r.json()["results"].as_array().unwrap()) {
        let (p, o) = (placed["partition"].as_u64().unwrap() as u32, placed["offset"].as_u64().unwrap());
        let stored = b.events("sdk-rust", p).into_iter().find(|(at, _)| *at == o).expect("stored").1;
        assert_eq!(&serde_json::from_value::<Event>(stored).unwrap(), e, "batch");
    }
}

/// The OpenAPI 3.1 document (`openapi/evmesh.yaml`) against the broker, checked by a validator
/// nobody here wrote (`openapi-core`, pinned in scripts/test.sh): every path and method of both
/// listeners driven, to a good answer and to its refusals, each request and answer validated
/// against the document. And `GET /openapi.yaml` on the admin listener serves the document's
/// exact bytes (compiled in).
#[test]
#[ignore = "needs python3 with openapi-core (scripts/test.sh installs it)"]
fn openapi_document_matches_every_answer() {
    let python = std::env::var("SDK_PYTHON").unwrap_or_else(|_| "python3".into());
    let root =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from);
    let b = TestBroker::start(&[]);
    let out = Command::new(&python)
        .arg(Path::new(&root).join("tests/interop/openapi_check.py"))
        .arg("run")
        .arg(&root)
        .arg(b.traffic.to_string())
        .arg(b.admin.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (scripts/test.sh installs it): {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("all checks passed"), "openapi_check.py:\n{text}");

    // The document the binary serves is the one it was built with: this checkout's file.
    let file =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/evmesh.yaml")).expect("openapi/evmesh.yaml");
    let r = b.admin().get("/openapi.yaml");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/yaml"));
    assert!(
        r.body == file,
        "GET /openapi.yaml served {} bytes that are not openapi/evmesh.yaml ({} bytes)",
        r.body.len(),
        file.len()
    );
}

/// A classic EventMesh TCP client in Python, written from the Java codec (no evmesh code):
/// HELLO, SUBSCRIBE, LISTEN, publish in both bodies, acks, request-reply and heartbeats
/// (issue 34).
#[test]
#[ignore = "needs Python 3 (scripts/test.sh runs it)"]
fn python_classic_tcp_client() {
    let b = TestBroker::start(&["--tcp-listen", "127.0.0.1:0"]);
    let tcp = b.tcp.expect("tcp listener").to_string();
    run_on_with_env(&b, "python3", "python_eventmesh_tcp.py", &[("EVMESH_TCP", &tcp)]);
}
