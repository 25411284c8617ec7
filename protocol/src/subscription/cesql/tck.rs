//! The CESQL TCK, read at run time from the shared/ folder beside the repository
//! (`../../shared/conformance/cesql_tck` from this crate): every case must give
//! the expected value and the expected error kind.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{compile, ErrorKind, Event, Value};

struct MapEvent(HashMap<String, Value>);

impl Event for MapEvent {
    fn attribute(&self, name: &str) -> Option<Value> {
        self.0.get(name).cloned()
    }
}

fn value(y: &serde_yaml::Value) -> Value {
    match y {
        serde_yaml::Value::Bool(b) => Value::Bool(*b),
        serde_yaml::Value::Number(n) => Value::Int(n.as_i64().expect("integer") as i32),
        serde_yaml::Value::String(s) => Value::Str(s.clone()),
        other => panic!("unexpected YAML value {other:?}"),
    }
}

fn tck_dir() -> PathBuf {
    let dir = std::env::var_os("EVMESH_CONFORMANCE").map(PathBuf::from).unwrap_or_else(|| {
        // Resolved at run time: a test binary built in another checkout reads this one's.
        let root = std::env::var_os("CARGO_MANIFEST_DIR").map_or(env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
        root.join("../../shared/conformance")
    });
    dir.join("cesql_tck")
}

#[test]
fn cesql_tck_passes_completely() {
    let mut files: Vec<_> = std::fs::read_dir(tck_dir())
        .expect("the CESQL TCK under shared/conformance beside the repository")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let (mut total, mut failures) = (0, Vec::new());
    for file in files {
        let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        for case in doc["tests"].as_sequence().unwrap() {
            total += 1;
            let name = serde_yaml::to_string(&case["name"]).unwrap();
            let name = name.trim();
            let expr_text = match &case["expression"] {
                serde_yaml::Value::String(s) => s.clone(),
                other => serde_yaml::to_string(other).unwrap().trim().to_string(),
            };
            let want_error = case.get("error").and_then(|e| e.as_str());
            let want_value = case.get("result").map(value);
            let mut attrs: HashMap<String, Value> = HashMap::new();
            if let Some(ev) = case.get("event").and_then(|e| e.as_mapping()) {
                for (k, v) in ev {
                    attrs.insert(k.as_str().unwrap().to_string(), value(v));
                }
            } else {
                for (k, v) in [("specversion", "1.0"), ("id", "tck-id"), ("source", "/tck"), ("type", "tck.type")] {
                    attrs.insert(k.into(), Value::Str(v.into()));
                }
            }
            if let Some(ov) = case.get("eventOverrides").and_then(|e| e.as_mapping()) {
                for (k, v) in ov {
                    attrs.insert(k.as_str().unwrap().to_string(), value(v));
                }
            }
            let (got_value, got_error) = match compile(&expr_text) {
                // A parse error evaluates to false, as the TCK expects.
                Err(_) => (Some(Value::Bool(false)), Some(ErrorKind::Parse)),
                Ok(expr) => {
                    let out = expr.evaluate(&MapEvent(attrs));
                    (Some(out.value), out.error)
                }
            };
            let value_ok = want_value.is_none() || got_value == want_value;
            let error_ok = want_error == got_error.map(ErrorKind::tck_name);
            if !(value_ok && error_ok) {
                failures.push(format!(
                    "{}: {name}: `{expr_text}` want {want_value:?}/{want_error:?}, got {got_value:?}/{got_error:?}",
                    file.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    println!("CESQL TCK: {}/{total} passed", total - failures.len());
    assert!(failures.is_empty(), "{} of {total} TCK cases failed:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(total, 275, "the TCK has 275 cases");
}

#[test]
fn hostile_nesting_is_a_parse_error_not_a_stack_overflow() {
    for text in [
        "(".repeat(100_000),
        "NOT ".repeat(100_000) + "TRUE",
        "-".repeat(100_000) + "1",
        vec!["TRUE"; 100_000].join(" AND "),
    ] {
        assert!(compile(&text).is_err());
    }
    let ok = vec!["TRUE"; 30].join(" AND ");
    assert!(compile(&ok).unwrap().matches(&MapEvent(HashMap::new())));
}
