//! The CESQL parser and evaluator on arbitrary text: never panic, never overflow the stack.
#![no_main]

use evmesh_protocol::subscription::cesql::{compile, Event, Value};
use libfuzzer_sys::fuzz_target;

struct Ev;

impl Event for Ev {
    fn attribute(&self, name: &str) -> Option<Value> {
        match name {
            "id" => Some(Value::Str("1".into())),
            "type" => Some(Value::Str("com.example.x".into())),
            "n" => Some(Value::Int(-7)),
            "b" => Some(Value::Bool(true)),
            _ => None,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(expr) = compile(text) {
            let _ = expr.evaluate(&Ev);
        }
    }
});
