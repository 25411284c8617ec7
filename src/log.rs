//! The broker's own log: one line per notable event (start, stop, configuration, a shard's
//! death, refusals, dead letters, cluster changes), to standard error, as text
//! (`evmesh: what happened key=value ...`) or as one JSON object per line (`log_format =
//! json`: `ts`, `level`, `target`, `msg`, the fields, and `trace_id` when the event has one).
//!
//! `log_level` filters like `RUST_LOG`: a default level, then `target=level` pairs
//! (`warn,dlq=info,cluster=debug`). Each target may write [`PER_SECOND`] lines a second; what
//! is over is counted and said with the next line that passes, so a flood of bad clients
//! cannot flood the log.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Lines per target per second at most.
pub const PER_SECOND: u32 = 20;

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// How much a line matters (most first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    fn parse(s: &str) -> Option<Level> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" | "trace" => Level::Debug,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

/// A `log_level` value: the default level and the targets' own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    default: Level,
    targets: Vec<(String, Level)>,
}

impl Filter {
    /// Parses `level[,target=level]...`; the error says which part is wrong.
    pub fn parse(s: &str) -> Result<Filter, String> {
        let mut f = Filter { default: Level::Info, targets: Vec::new() };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || format!("{part:?}: want error|warn|info|debug, or target=level");
            match part.split_once('=') {
                Some((t, l)) => f.targets.push((t.trim().to_owned(), Level::parse(l).ok_or_else(bad)?)),
                None => f.default = Level::parse(part).ok_or_else(bad)?,
            }
        }
        Ok(f)
    }

    fn allows(&self, target: &str, level: Level) -> bool {
        let max = self.targets.iter().rev().find(|(t, _)| t == target).map_or(self.default, |(_, l)| *l);
        level <= max
    }
}

static FORMAT: AtomicU8 = AtomicU8::new(0);
static FILTER: OnceLock<Filter> = OnceLock::new();
/// A target's rate: the second it counts in, lines written in it, lines suppressed since the
/// last one written.
type Bucket = (Instant, u32, u64);
static BUCKETS: Mutex<Option<HashMap<&'static str, Bucket>>> = Mutex::new(None);

/// Sets the format and the filter (once; later calls keep the first).
pub fn init(format: Format, filter: Filter) {
    FORMAT.store(format as u8, Relaxed);
    let _ = FILTER.set(filter);
}

fn format() -> Format {
    if FORMAT.load(Relaxed) == Format::Json as u8 {
        Format::Json
    } else {
        Format::Text
    }
}

/// Whether a line of `target` at `level` would be written (before the rate limit).
pub fn enabled(target: &str, level: Level) -> bool {
    FILTER.get().map_or(level <= Level::Info, |f| f.allows(target, level))
}

/// Writes one line: `msg` and its `fields`, if the filter and the target's rate allow.
pub fn event(level: Level, target: &'static str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    if !enabled(target, level) {
        return;
    }
    let suppressed = {
        let mut buckets = BUCKETS.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.get_or_insert_with(HashMap::new).entry(target).or_insert((Instant::now(), 0, 0));
        if b.0.elapsed().as_secs() >= 1 {
            (b.0, b.1) = (Instant::now(), 0);
        }
        if b.1 >= PER_SECOND {
            b.2 += 1;
            return;
        }
        b.1 += 1;
        std::mem::take(&mut b.2)
    };
    eprintln!("{}", line(format(), level, target, msg, fields, suppressed));
}

/// The line as written (without the newline).
fn line(
    format: Format,
    level: Level,
    target: &str,
    msg: &str,
    fields: &[(&str, &dyn std::fmt::Display)],
    suppressed: u64,
) -> String {
    let mut out = String::with_capacity(96 + msg.len());
    match format {
        Format::Text => {
            out.push_str("evmesh: ");
            escape_into(msg, false, &mut out);
            for (k, v) in fields {
                let _ = write!(out, " {k}=");
                escape_into(&v.to_string(), true, &mut out);
            }
            if suppressed > 0 {
                let _ = write!(out, " (and {suppressed} more {target} lines not written)");
            }
        }
        Format::Json => {
            let mut obj = serde_json::Map::new();
            // The fields first: a field named like one of the line's own keys does not replace it.
            for (k, v) in fields {
                obj.insert((*k).into(), v.to_string().into());
            }
            obj.insert(
                "ts".into(),
                evmesh_protocol::adaptor::rfc3339_from_micros(crate::model::clock::now_micros()).into(),
            );
            obj.insert("level".into(), level.name().into());
            obj.insert("target".into(), target.into());
            obj.insert("msg".into(), msg.into());
            if suppressed > 0 {
                obj.insert("suppressed".into(), suppressed.into());
            }
            out = serde_json::Value::Object(obj).to_string();
        }
    }
    out
}

/// `s` for a text line: control characters escaped (`\n`, `\u{1b}`), so nothing a client
/// sent can start a line of its own; a `value` with a space, a quote or nothing in it quoted.
fn escape_into(s: &str, value: bool, out: &mut String) {
    let quote = value && (s.is_empty() || s.contains([' ', '"', '=']));
    if quote {
        out.push('"');
    }
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '"' if quote => out.push_str("\\\""),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    if quote {
        out.push('"');
    }
}

/// `log::event(Level::Warn, ...)`, shorter.
pub fn warn(target: &'static str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    event(Level::Warn, target, msg, fields);
}

/// `log::event(Level::Info, ...)`, shorter.
pub fn info(target: &'static str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    event(Level::Info, target, msg, fields);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_read_like_rust_log() {
        let f = Filter::parse("warn, dlq=debug ,cluster=error").unwrap();
        assert!(f.allows("dlq", Level::Debug) && f.allows("x", Level::Warn) && !f.allows("x", Level::Info));
        assert!(!f.allows("cluster", Level::Warn));
        assert_eq!(Filter::parse("").unwrap(), Filter { default: Level::Info, targets: vec![] });
        assert!(Filter::parse("loud").unwrap_err().contains("loud"));
        assert!(Filter::parse("dlq=loud").is_err());
    }

    #[test]
    fn lines_as_text_and_as_json() {
        let n = 3;
        let text = line(Format::Text, Level::Warn, "dlq", "dead-lettered", &[("topic", &"orders"), ("n", &n)], 2);
        assert_eq!(text, "evmesh: dead-lettered topic=orders n=3 (and 2 more dlq lines not written)");
        let json = line(Format::Json, Level::Warn, "dlq", "dead-lettered", &[("trace_id", &"ab")], 0);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (v["level"].as_str(), v["target"].as_str(), v["trace_id"].as_str()),
            (Some("warn"), Some("dlq"), Some("ab"))
        );
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        assert!(!json.contains('\n'));
        // Nothing a value holds starts a line, or passes for one of the line's own keys.
        let forged = "x\nevmesh: started instance=forged";
        let text = line(Format::Text, Level::Warn, "t", "a\rb", &[("v", &forged), ("q", &"say \"hi\"")], 0);
        assert_eq!(text, r#"evmesh: a\rb v="x\nevmesh: started instance=forged" q="say \"hi\"""#);
        assert!(!text.contains('\n'));
        let json = line(Format::Json, Level::Warn, "t", "real", &[("msg", &"forged"), ("level", &"debug")], 0);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!((v["msg"].as_str(), v["level"].as_str()), (Some("real"), Some("warn")));
    }
}
