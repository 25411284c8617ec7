//! The Grafana dashboard (`deploy/grafana/evmesh.json`) and the Prometheus rules
//! (`deploy/prometheus/evmesh-rules.yml`) name only what a running broker exposes: every
//! `evmesh_*` name in a PromQL expression (the panels' queries, the template variables' queries,
//! the rules' `expr:`) is a metric family of `/metrics` (`# TYPE name`; a histogram only through
//! its `_bucket`, `_sum` and `_count`), every `evmesh:*` name is one a rule records, and every
//! label a selector or a `by (...)` names is one the broker puts on its samples. The dashboard
//! parses, its panel ids are unique and every query goes through the `${datasource}` variable;
//! every rule has its fields and every alert is explained in `deploy/README.md`. A metric renamed
//! without the dashboard or the rules fails here, not on an operator's empty graph.
//!
//! Plain Rust and no YAML crate: the rules file is kept simple enough (one `key: value` a line,
//! block scalars for long values) to be read line by line.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use super::util::{event, wait_for, TestBroker};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A PromQL token: a name (metric, label, function or keyword), a string literal, a number or
/// duration, or one punctuation character.
#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Str,
    Number,
    Punct(char),
}

/// Splits a PromQL expression into tokens. Names are `[A-Za-z_][A-Za-z0-9_:]*`; string literals
/// (`"..."`, `'...'`, `` `...` ``, with backslash escapes) are skipped whole, so a label value
/// never reads as a name; a Grafana variable is `$` then a name.
fn tokens(expr: &str) -> Vec<Token> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            // 0.99, 1e6, 5m, 1h30m
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Number);
        } else if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            assert!(i < chars.len(), "unterminated string in {expr:?}");
            i += 1;
            out.push(Token::Str);
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// What an expression names: the `evmesh_*` metrics with the labels each selector matches on,
/// the `evmesh:*` recorded series, and the labels of its `by`/`without`/`on`/`ignoring`/
/// `group_left`/`group_right` clauses.
#[derive(Debug, Default)]
struct Names {
    metrics: BTreeMap<String, BTreeSet<String>>,
    recorded: BTreeSet<String>,
    grouping: BTreeSet<String>,
}

fn names(expr: &str) -> Names {
    let t = tokens(expr);
    let mut n = Names::default();
    let mut i = 0;
    while i < t.len() {
        let Token::Ident(name) = &t[i] else {
            i += 1;
            continue;
        };
        if i > 0 && t[i - 1] == Token::Punct('$') {
            // A Grafana variable ($instance, $__rate_interval), not a name of the query.
            i += 1;
            continue;
        }
        if name.starts_with("evmesh:") {
            n.recorded.insert(name.clone());
        } else if name.starts_with("evmesh_") {
            let labels = n.metrics.entry(name.clone()).or_default();
            if t.get(i + 1) == Some(&Token::Punct('{')) {
                // Inside a selector only label names are names: the values are strings.
                i += 2;
                while i < t.len() && t[i] != Token::Punct('}') {
                    if let Token::Ident(label) = &t[i] {
                        labels.insert(label.clone());
                    }
                    i += 1;
                }
            }
        } else if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&name.as_str())
            && t.get(i + 1) == Some(&Token::Punct('('))
        {
            i += 2;
            while i < t.len() && t[i] != Token::Punct(')') {
                if let Token::Ident(label) = &t[i] {
                    n.grouping.insert(label.clone());
                }
                i += 1;
            }
        }
        i += 1;
    }
    n
}

/// The metric families of a Prometheus text exposition (`# TYPE name kind`), and the label
/// names each family's samples carry (a histogram's `_bucket`, `_sum` and `_count` samples
/// under the histogram's name).
struct Exposition {
    kinds: HashMap<String, String>,
    labels: HashMap<String, BTreeSet<String>>,
}

fn exposition(text: &str) -> Exposition {
    let mut kinds = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            let (name, kind) = (w.next().expect("a name"), w.next().expect("a kind"));
            kinds.insert(name.to_owned(), kind.to_owned());
        }
    }
    let mut labels: HashMap<String, BTreeSet<String>> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let sample = &line[..end];
        let family = family_of_sample(sample, &kinds).unwrap_or_else(|| panic!("a sample of no family: {line}"));
        let set = labels.entry(family.to_owned()).or_default();
        if line[end..].starts_with('{') {
            set.extend(sample_labels(&line[end + 1..]));
        }
    }
    Exposition { kinds, labels }
}

/// The family a sample's name belongs to.
fn family_of_sample<'a>(sample: &'a str, kinds: &HashMap<String, String>) -> Option<&'a str> {
    if kinds.contains_key(sample) {
        return Some(sample);
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| sample.strip_suffix(s))
        .find(|base| matches!(kinds.get(*base).map(String::as_str), Some("histogram" | "summary")))
}

/// The label names of a sample line, from just after its `{`.
fn sample_labels(mut s: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if s.is_empty() || s.starts_with('}') {
            return out;
        }
        let eq = s.find('=').unwrap_or_else(|| panic!("a label without a value: {s}"));
        out.push(s[..eq].trim().to_owned());
        // The quoted value, with backslash escapes.
        let v = &s[eq + 1..];
        assert!(v.starts_with('"'), "an unquoted label value: {s}");
        let mut escaped = false;
        let close = v[1..]
            .char_indices()
            .find(|&(_, c)| {
                let end = !escaped && c == '"';
                escaped = !escaped && c == '\\';
                end
            })
            .map(|(k, _)| k + 1)
            .unwrap_or_else(|| panic!("an unterminated label value: {s}"));
        s = &v[close + 1..];
    }
}

/// The family a name of a query reads, or why it reads none: a classic histogram has no
/// series under its own name, only `_bucket` (and `_sum`, `_count`).
fn family_of_query(name: &str, kinds: &HashMap<String, String>) -> Result<String, String> {
    match kinds.get(name).map(String::as_str) {
        Some("histogram") => Err(format!("{name} is a histogram: query its _bucket, _sum or _count")),
        Some(_) => Ok(name.to_owned()),
        None => {
            let found = [
                ("_bucket", &["histogram"][..]),
                ("_sum", &["histogram", "summary"][..]),
                ("_count", &["histogram", "summary"][..]),
            ]
            .iter()
            .find_map(|(suffix, allowed)| {
                let base = name.strip_suffix(suffix)?;
                allowed.contains(&kinds.get(base)?.as_str()).then(|| base.to_owned())
            });
            found.ok_or_else(|| format!("{name}: no such metric family in /metrics"))
        }
    }
}

/// A rule of the rules file: `record` or `alert`, its name, and its fields by dotted key
/// (`expr`, `for`, `labels.severity`, `annotations.summary`, ...).
#[derive(Debug)]
struct Rule {
    kind: String,
    name: String,
    line: usize,
    fields: BTreeMap<String, String>,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner.to_owned();
        }
    }
    v.to_owned()
}

/// Reads the rules of a Prometheus rules file line by line: each `- record:` or `- alert:` item
/// to the next line indented no deeper than its dash, its `key: value` lines, one level of
/// nested maps (`labels:`, `annotations:`) and block scalars (`|`, `>-`, ...), joined by spaces.
fn rules(yaml: &str) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut current: Option<Rule> = None;
    // The rule's keys' indentation; the nested map being read (its key and indentation); the
    // block scalar being read (its dotted key and the indentation of the line that opened it).
    let mut key_indent = 0;
    let mut map: Option<(String, usize)> = None;
    let mut block: Option<(String, usize)> = None;
    for (n, line) in yaml.lines().enumerate() {
        let blank = line.trim().is_empty();
        if let Some((key, at)) = &block {
            if blank || indent(line) > *at {
                let rule = current.as_mut().expect("a block scalar inside a rule");
                let v = rule.fields.entry(key.clone()).or_default();
                if !blank {
                    if !v.is_empty() {
                        v.push(' ');
                    }
                    v.push_str(line.trim());
                }
                continue;
            }
            block = None;
        }
        if blank || line.trim_start().starts_with('#') {
            continue;
        }
        let at = indent(line);
        let item = line.trim_start().strip_prefix("- ");
        let kind = item.and_then(|i| ["record", "alert"].into_iter().find(|k| i.starts_with(&format!("{k}:"))));
        if let Some(kind) = kind {
            out.extend(current.take());
            let name = unquote(&item.unwrap()[kind.len() + 1..]);
            current = Some(Rule { kind: kind.to_owned(), name, line: n + 1, fields: BTreeMap::new() });
            key_indent = at + 2;
            map = None;
            continue;
        }
        if current.is_none() || at < key_indent || item.is_some() {
            out.extend(current.take());
            continue;
        }
        let rule = current.as_mut().expect("checked above");
        let (key, value) =
            line.trim().split_once(':').unwrap_or_else(|| panic!("line {}: not `key: value`: {line}", n + 1));
        let (key, value) = (key.trim(), value.trim());
        let dotted = if at == key_indent {
            map = None;
            key.to_owned()
        } else {
            let (parent, parent_at) =
                map.as_ref().unwrap_or_else(|| panic!("line {}: indented under no map: {line}", n + 1));
            assert!(at > *parent_at, "line {}: {line}", n + 1);
            format!("{parent}.{key}")
        };
        if value.is_empty() && at == key_indent {
            map = Some((dotted, at));
        } else if ["|", "|-", "|+", ">", ">-", ">+"].contains(&value) {
            rule.fields.insert(dotted.clone(), String::new());
            block = Some((dotted, at));
        } else {
            rule.fields.insert(dotted, unquote(value));
        }
    }
    out.extend(current);
    out
}

/// Every panel of a dashboard, rows and the panels of collapsed rows included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    fn walk<'a>(list: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every `datasource` object anywhere in the dashboard names the `${datasource}` variable, or
/// Grafana's built-in annotations source: no uid of one Grafana's data source is baked in.
fn assert_datasources_are_the_variable(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                if k == "datasource" && child.is_object() {
                    let uid = child["uid"].as_str().unwrap_or_default();
                    let builtin = child["type"] == "grafana";
                    assert!(uid == "${datasource}" || builtin, "{path}.datasource: uid {uid:?}, not ${{datasource}}");
                }
                assert_datasources_are_the_variable(child, &format!("{path}.{k}"));
            }
        }
        serde_json::Value::Array(list) => {
            for (i, child) in list.iter().enumerate() {
                assert_datasources_are_the_variable(child, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

/// The PromQL expressions of a dashboard, each with where it is: the panels' targets and the
/// query variables' queries.
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            out.push((format!("panel {} ({}) target {}", p["id"], p["title"], t["refId"]), expr.to_owned()));
        }
    }
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let query = v["query"].as_str().or_else(|| v["query"]["query"].as_str());
        for q in [v["definition"].as_str(), query].into_iter().flatten() {
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

/// Traffic enough for the label-bearing series: events stored, a subscription read over
/// long-poll with one event acked and the rest let go to the dead-letter topic (one attempt,
/// a 1 s ack timeout), so `evmesh_consumer_lag` has its samples.
fn traffic(b: &TestBroker) -> String {
    for i in 0..6 {
        assert_eq!(b.publish("orders", &event(&format!("o-{i}"))).status, 202);
    }
    let def = br#"{"subscription":"billing","topic":"orders","start":"earliest","ackTimeoutMs":1000,"maxAttempts":1}"#;
    let r = b.client().post("/events/subscribe", "application/json", def);
    assert_eq!(r.status, 201, "{}", r.text());
    let mut acked = false;
    wait_for(Duration::from_secs(30), || {
        let r = b.client().get("/events/poll?subscription=billing&max=100&waitMs=200");
        if r.status == 200 && !acked {
            let first = r.json()[0]["emdeliveryid"].clone();
            let ack = serde_json::json!({"subscription": "billing", "ids": [first]});
            let a = b.client().post("/events/ack", "application/json", ack.to_string().as_bytes());
            assert_eq!(a.status, 200, "{}", a.text());
            acked = true;
        }
        let text = b.admin().get("/metrics").text();
        let dead: f64 = text
            .lines()
            .filter(|l| l.starts_with("evmesh_dead_lettered_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        let lag = text.lines().any(|l| l.starts_with("evmesh_consumer_lag{subscription=\"billing\""));
        (acked && dead > 0.0 && lag).then_some(text)
    })
}

/// Labels every deployment adds (the scrape's), besides those on the broker's samples.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Labels of families that have samples only with tenants configured (`evmesh_tenant_*`).
const TENANT_LABELS: [&str; 1] = ["tenant"];

#[test]
fn dashboard_and_rules_name_only_series_the_broker_exposes() {
    let b = TestBroker::start(&[]);
    let metrics = traffic(&b);
    let exp = exposition(&metrics);
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/evmesh.json")).expect("deploy/grafana/evmesh.json is JSON");
    let rules = rules(&read("deploy/prometheus/evmesh-rules.yml"));
    let recorded: BTreeSet<&str> = rules.iter().filter(|r| r.kind == "record").map(|r| r.name.as_str()).collect();

    let mut exprs = dashboard_exprs(&dashboard);
    for r in &rules {
        let expr = r.fields.get("expr").cloned().unwrap_or_default();
        exprs.push((format!("deploy/prometheus/evmesh-rules.yml:{} {} {}", r.line, r.kind, r.name), expr));
    }
    let all_labels: BTreeSet<&str> =
        exp.labels.values().flatten().map(String::as_str).chain(TARGET_LABELS).chain(TENANT_LABELS).collect();
    let mut wrong = Vec::new();
    let mut read_families = BTreeSet::new();
    for (place, expr) in &exprs {
        if expr.trim().is_empty() {
            wrong.push(format!("{place}: no expression"));
            continue;
        }
        let n = names(expr);
        if n.metrics.is_empty() && n.recorded.is_empty() && !expr.contains("up{") {
            wrong.push(format!("{place}: names no evmesh series: {expr}"));
        }
        for (metric, labels) in &n.metrics {
            let family = match family_of_query(metric, &exp.kinds) {
                Ok(f) => f,
                Err(e) => {
                    wrong.push(format!("{place}: {e}"));
                    continue;
                }
            };
            // A family with no samples here (the per-tenant ones) cannot say its labels.
            if let Some(has) = exp.labels.get(&family) {
                for l in labels.iter().filter(|l| !TARGET_LABELS.contains(&l.as_str()) && !has.contains(*l)) {
                    wrong.push(format!("{place}: {metric} has no label {l:?} (it has {has:?})"));
                }
            }
            read_families.insert(family);
        }
        for r in n.recorded.iter().filter(|r| !recorded.contains(r.as_str())) {
            wrong.push(format!("{place}: {r} is recorded by no rule"));
        }
        for l in n.grouping.iter().filter(|l| !all_labels.contains(l.as_str())) {
            wrong.push(format!("{place}: groups by {l:?}, a label no series has"));
        }
    }
    assert!(wrong.is_empty(), "deploy/ names what /metrics does not have:\n{}", wrong.join("\n"));
    // The issue's signals are all read somewhere.
    for family in [
        "evmesh_events_published_total",
        "evmesh_deliveries_total",
        "evmesh_publish_latency_seconds",
        "evmesh_consumer_lag",
        "evmesh_dead_lettered_total",
        "evmesh_redeliveries_total",
        "evmesh_mailbox_depth",
        "evmesh_connections_open",
        "evmesh_memory_shed_total",
        "evmesh_tenant_limited_total",
        "evmesh_filter_budget_exceeded_total",
        "evmesh_connections_rejected_total",
        "evmesh_ready",
        "evmesh_shard_heartbeat_age_seconds",
        "evmesh_descriptors_short",
        "evmesh_trace_spans_exported_total",
        "evmesh_trace_spans_dropped_total",
        "evmesh_trace_spans_failed_total",
    ] {
        assert!(read_families.contains(family), "deploy/ does not read {family}");
    }
}

#[test]
fn the_dashboard_is_well_formed() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/evmesh.json")).expect("deploy/grafana/evmesh.json is JSON");
    assert_eq!(dashboard["schemaVersion"], 39);
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty() && u.len() <= 40), "a dashboard uid");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard.get("id").is_none_or(|id| id.is_null()), "no instance-specific dashboard id");

    let vars = dashboard["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name} variable"));
    let ds = var("datasource");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    let instance = var("instance");
    assert_eq!(instance["type"], "query");
    let definition = instance["definition"].as_str().unwrap_or_default();
    assert!(
        definition.starts_with("label_values(evmesh_") && definition.ends_with(", instance)"),
        "$instance comes from label_values(evmesh_..., instance): {definition}"
    );
    assert_datasources_are_the_variable(&dashboard, "dashboard");

    let all = panels(&dashboard);
    let mut ids = BTreeSet::new();
    for p in &all {
        let id = p["id"].as_u64().unwrap_or_else(|| panic!("a panel without an id: {}", p["title"]));
        assert!(ids.insert(id), "panel id {id} twice");
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "panel {id}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {id} ({})", p["title"]);
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {id}: no targets"));
        assert!(!targets.is_empty(), "panel {id}: no targets");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "panel {id}: a target without expr");
            assert!(refs.insert(t["refId"].as_str().expect("a refId")), "panel {id}: refId twice");
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {id} target {}", t["refId"]);
        }
    }
    let rows: Vec<&str> = all.iter().filter(|p| p["type"] == "row").filter_map(|p| p["title"].as_str()).collect();
    for row in ["Overview", "Latency", "Subscriptions", "Shards", "Protection", "Tracing"] {
        assert!(rows.contains(&row), "no {row} row: {rows:?}");
    }
}

#[test]
fn every_rule_has_its_fields_and_every_alert_is_explained() {
    let rules = rules(&read("deploy/prometheus/evmesh-rules.yml"));
    let readme = read("deploy/README.md");
    let mut seen = BTreeSet::new();
    for r in &rules {
        let at = format!("deploy/prometheus/evmesh-rules.yml:{} {}", r.line, r.name);
        assert!(seen.insert((r.kind.clone(), r.name.clone())), "{at}: twice");
        assert!(r.fields.get("expr").is_some_and(|e| !e.trim().is_empty()), "{at}: no expr");
        if r.kind == "record" {
            // level:metric:operations, the Prometheus naming of recorded series.
            let parts: Vec<&str> = r.name.split(':').collect();
            assert!(parts.len() == 3 && parts[0] == "evmesh" && parts.iter().all(|p| !p.is_empty()), "{at}");
            let extra: Vec<&String> = r.fields.keys().filter(|k| *k != "expr" && !k.starts_with("labels.")).collect();
            assert!(extra.is_empty(), "{at}: a recording rule with {extra:?}");
        } else {
            assert!(r.name.starts_with("Evmesh"), "{at}: alerts are named Evmesh*");
            assert!(r.fields.contains_key("for"), "{at}: no `for`");
            let severity = r.fields.get("labels.severity").map(String::as_str);
            assert!(matches!(severity, Some("critical" | "warning" | "info")), "{at}: severity {severity:?}");
            for k in ["annotations.summary", "annotations.description"] {
                assert!(r.fields.get(k).is_some_and(|v| !v.trim().is_empty()), "{at}: no {k}");
            }
            assert!(readme.contains(&r.name), "{at}: deploy/README.md does not explain it");
        }
    }
    let alerts: BTreeSet<&str> = rules.iter().filter(|r| r.kind == "alert").map(|r| r.name.as_str()).collect();
    for alert in [
        "EvmeshDown",
        "EvmeshRestarted",
        "EvmeshNotReady",
        "EvmeshShardStalled",
        "EvmeshConsumerLagHigh",
        "EvmeshConsumerLagGrowing",
        "EvmeshDeadLetters",
        "EvmeshMemoryShedding",
        "EvmeshDescriptorShortage",
        "EvmeshTraceSpansLost",
    ] {
        assert!(alerts.contains(alert), "no {alert} alert: {alerts:?}");
    }
    assert!(rules.iter().any(|r| r.kind == "record"), "no recording rules");
    // The alerts that have a series of their own read it, not a proxy or an outside probe.
    for (alert, family) in [
        ("EvmeshNotReady", "evmesh_ready"),
        ("EvmeshShardStalled", "evmesh_shard_heartbeat_age_seconds"),
        ("EvmeshDescriptorShortage", "evmesh_descriptors_short"),
        ("EvmeshTraceSpansLost", "evmesh_trace_spans_dropped_total"),
        ("EvmeshTraceSpansLost", "evmesh_trace_spans_failed_total"),
    ] {
        let rule = rules.iter().find(|r| r.kind == "alert" && r.name == alert).expect("checked above");
        let read = families_read(&rule.fields["expr"], &rules);
        assert!(read.contains(family), "{alert} does not read {family}: it reads {read:?}");
    }
    if let Some(r) = rules.iter().find(|r| r.fields["expr"].contains("probe_success")) {
        panic!("{} {}: reads the blackbox probe, an optional extra: {}", r.kind, r.name, r.fields["expr"]);
    }
}

/// The `evmesh_*` names an expression reads, through the recording rules it names.
fn families_read(expr: &str, rules: &[Rule]) -> BTreeSet<String> {
    let n = names(expr);
    let mut out: BTreeSet<String> = n.metrics.into_keys().collect();
    for recorded in &n.recorded {
        let rule = rules.iter().find(|r| r.kind == "record" && &r.name == recorded);
        if let Some(expr) = rule.and_then(|r| r.fields.get("expr")) {
            out.extend(families_read(expr, rules));
        }
    }
    out
}

/// The readers themselves, on the shapes they meet.
#[test]
fn the_promql_and_rules_readers_read_what_they_should() {
    let n = names(
        r#"histogram_quantile(0.99, sum by (instance, le) (rate(evmesh_publish_latency_seconds_bucket{instance=~"$instance", x="evmesh_not_a_metric"}[$__rate_interval]))) / on (job) evmesh:deliveries:rate1m"#,
    );
    assert_eq!(n.metrics.keys().map(String::as_str).collect::<Vec<_>>(), ["evmesh_publish_latency_seconds_bucket"]);
    let selected: Vec<&str> = n.metrics["evmesh_publish_latency_seconds_bucket"].iter().map(String::as_str).collect();
    assert_eq!(selected, ["instance", "x"]);
    assert_eq!(n.recorded.iter().map(String::as_str).collect::<Vec<_>>(), ["evmesh:deliveries:rate1m"]);
    assert_eq!(n.grouping.iter().map(String::as_str).collect::<Vec<_>>(), ["instance", "job", "le"]);
    assert!(names("sum(rate(evmesh_acks_total[5m])) by (shard)").grouping.contains("shard"));

    let kinds: HashMap<String, String> =
        [("evmesh_h", "histogram"), ("evmesh_c_total", "counter")].map(|(a, b)| (a.to_owned(), b.to_owned())).into();
    assert_eq!(family_of_query("evmesh_h_bucket", &kinds), Ok("evmesh_h".to_owned()));
    assert_eq!(family_of_query("evmesh_h_count", &kinds), Ok("evmesh_h".to_owned()));
    assert_eq!(family_of_query("evmesh_c_total", &kinds), Ok("evmesh_c_total".to_owned()));
    assert!(family_of_query("evmesh_h", &kinds).is_err());
    assert!(family_of_query("evmesh_c_total_bucket", &kinds).is_err());
    assert!(family_of_query("evmesh_gone", &kinds).is_err());

    let exp = exposition(
        "# TYPE evmesh_h histogram\nevmesh_h_bucket{shard=\"0\",le=\"+Inf\"} 1\nevmesh_h_sum{shard=\"0\"} 1\n\
         # TYPE evmesh_g gauge\nevmesh_g{subscription=\"a,\\\"b\",client=\"\"} 3\nevmesh_g 1\n",
    );
    let labels = |family: &str| exp.labels[family].iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(labels("evmesh_h"), ["le", "shard"]);
    assert_eq!(labels("evmesh_g"), ["client", "subscription"]);

    let yaml = r#"
groups:
  - name: g
    rules:
      - record: evmesh:a:rate1m
        expr: sum(rate(evmesh_a_total[1m]))

      - alert: EvmeshA
        expr: |
          evmesh:a:rate1m
            > 0
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "A {{ $labels.instance }}"
          description: >-
            one
            two
      # a comment between rules
  - name: h
    rules:
      - alert: EvmeshB
        expr: up == 0
"#;
    let r = rules(yaml);
    assert_eq!(
        r.iter().map(|r| (r.kind.as_str(), r.name.as_str())).collect::<Vec<_>>(),
        [("record", "evmesh:a:rate1m"), ("alert", "EvmeshA"), ("alert", "EvmeshB")]
    );
    assert_eq!(r[0].fields["expr"], "sum(rate(evmesh_a_total[1m]))");
    assert_eq!(r[1].fields["expr"], "evmesh:a:rate1m > 0");
    assert_eq!(r[1].fields["for"], "5m");
    assert_eq!(r[1].fields["labels.severity"], "warning");
    assert_eq!(r[1].fields["annotations.summary"], "A {{ $labels.instance }}");
    assert_eq!(r[1].fields["annotations.description"], "one two");
    assert_eq!(r[2].fields["expr"], "up == 0");
}
