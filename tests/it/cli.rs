//! `evmesh pub`, the first-tour client.

use std::io::Write;
use std::process::{Command, Stdio};

use super::util::TestBroker;

fn evmesh() -> Command {
    Command::new(env!("CARGO_BIN_EXE_evmesh"))
}

#[test]
fn pub_from_flags_and_from_stdin() {
    let b = TestBroker::start(&["--default-partitions", "1"]);
    let url = format!("http://{}", b.traffic);
    let out = evmesh()
        .args([
            "pub",
            "--url",
            &url,
            "--topic",
            "cli",
            "--type",
            "com.example.cli",
            "--id",
            "c-1",
            "--data",
            r#"{"a":1}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"partition":0,"offset":0}"#);
    let mut child = evmesh()
        .args(["pub", "--url", &url, "--topic", "cli"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"specversion":"1.0","id":"c-2","source":"/stdin","type":"t","data":"hi"}"#)
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let stored = b.events("cli", 0);
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].1["id"], "c-1");
    assert_eq!(stored[0].1["data"], serde_json::json!({"a": 1}));
    assert_eq!(stored[1].1["source"], "/stdin");
    // A refused event is an error exit with the problem on stdout.
    let out = evmesh().args(["pub", "--url", &url, "--topic", "bad/topic", "--type", "t"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\":400"));
}
