//! Events built by the official CloudEvents SDKs (Python and JavaScript), in every content mode,
//! are accepted and read back faithfully; independent Python clients receive and ack them over
//! WebSocket, SSE and long-poll. The test command installs both SDKs; the scripts in
//! tests/interop assert on what they read back and exit non-zero on any difference.

use std::path::Path;
use std::process::Command;

use super::util::TestBroker;

fn run_script(program: &str, script: &str) {
    let b = TestBroker::start(&["--redelivery-backoff-ms", "50"]);
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
