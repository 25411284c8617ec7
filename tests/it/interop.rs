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
