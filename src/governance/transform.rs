//! The transformer: per-topic rules that reshape an event on its way in (after the ACL, before
//! the router and the log). Set, remove or rename attributes, and build `data` from a template
//! whose `${name}` variables are JSONPath expressions into the event as published.
//!
//! The template is JSON, and substitution happens on its tree, never on its text: a string
//! that is exactly `"${name}"` becomes the variable's value (any JSON); `${name}` inside a
//! longer string is replaced by the value's text (a string as is, anything else as JSON). A
//! variable's value can therefore never add structure to the result. What the rules make is
//! parsed again as a structured CloudEvent before it is stored, so a transformed event is a
//! valid one or the publish is refused (400). Every rule is checked when it is set: names,
//! paths, references, sizes, and that no required attribute can be lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A topic's transformation, as `PUT /admin/transformers/{topic}` takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSpec {
    /// Attribute -> value (a string, a boolean or an integer), set after `rename` and `remove`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, Value>,
    /// Attributes removed (after `rename`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
    /// Attribute -> its new name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rename: BTreeMap<String, String>,
    /// Variable -> a JSONPath into the event as published (`$.data.order.id`, `$.source`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
    /// The new `data`: JSON in which `${name}` refers to a variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// Attributes every event must keep.
const REQUIRED: [&str; 4] = ["specversion", "id", "source", "type"];
/// Most variables, steps in a path, attributes named in one transformation.
const MAX_VARIABLES: usize = 64;
const MAX_STEPS: usize = 32;
const MAX_ATTRIBUTES: usize = 128;
/// Largest template (its JSON text).
const MAX_TEMPLATE: usize = 64 * 1024;

/// One step of a JSONPath: a member or an array index.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// A checked transformation, ready to apply.
#[derive(Debug, Clone)]
pub struct Transformer {
    pub topic: String,
    pub spec: TransformSpec,
    variables: Vec<(String, Vec<Step>)>,
}

/// CloudEvents attribute names: lower-case letters and digits (`data` is the template's).
fn valid_attribute(name: &str) -> bool {
    (1..=20).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name != "data"
        && name != "data_base64"
}

fn valid_variable(name: &str) -> bool {
    let mut b = name.bytes();
    (1..=64).contains(&name.len())
        && b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// `$`, then `.name`, `['name']` or `[n]` steps.
fn parse_path(path: &str) -> Result<Vec<Step>, String> {
    let bad = |why: &str| format!("JSONPath {path:?}: {why}");
    let mut rest = path.strip_prefix('$').ok_or_else(|| bad("must start with $"))?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if steps.len() == MAX_STEPS {
            return Err(bad(&format!("more than {MAX_STEPS} steps")));
        }
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(bad("a .member is letters, digits, _ and -"));
            }
            steps.push(Step::Key(name.to_owned()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or_else(|| bad("unclosed ['"))?;
            steps.push(Step::Key(r[..end].to_owned()));
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(|| bad("unclosed ["))?;
            let i = r[..end].parse().map_err(|_| bad("an [index] is a non-negative integer"))?;
            steps.push(Step::Index(i));
            rest = &r[end + 1..];
        } else {
            return Err(bad("expected .member, ['member'] or [index]"));
        }
    }
    Ok(steps)
}

fn lookup<'v>(event: &'v Value, steps: &[Step]) -> Option<&'v Value> {
    steps.iter().try_fold(event, |v, s| match s {
        Step::Key(k) => v.get(k),
        Step::Index(i) => v.get(*i),
    })
}

/// The `${name}` references in a template string, in order.
fn references(s: &str) -> impl Iterator<Item = Result<&str, String>> + '_ {
    let mut rest = s;
    std::iter::from_fn(move || {
        let start = rest.find("${")?;
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            rest = "";
            return Some(Err(format!("unclosed ${{ in {s:?}")));
        };
        rest = &after[end + 1..];
        Some(Ok(&after[..end]))
    })
}

fn template_strings<'t>(v: &'t Value, out: &mut Vec<&'t str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|v| template_strings(v, out)),
        Value::Object(o) => o.values().for_each(|v| template_strings(v, out)),
        _ => {}
    }
}

impl Transformer {
    /// Checks `spec` for `topic`: the error says what is wrong.
    pub fn new(topic: &str, spec: TransformSpec) -> Result<Transformer, String> {
        let named = spec.set.len() + spec.remove.len() + spec.rename.len();
        if named == 0 && spec.data.is_none() {
            return Err("a transformer sets, removes or renames attributes, or builds data".into());
        }
        if named > MAX_ATTRIBUTES || spec.variables.len() > MAX_VARIABLES {
            return Err(format!("at most {MAX_ATTRIBUTES} attributes and {MAX_VARIABLES} variables"));
        }
        let attrs = spec.set.keys().chain(&spec.remove).chain(spec.rename.keys()).chain(spec.rename.values());
        for a in attrs {
            if !valid_attribute(a) {
                return Err(format!("{a:?} is not an attribute name ([a-z0-9]{{1,20}}; data is the template's)"));
            }
        }
        for (name, v) in &spec.set {
            match (name.as_str(), v) {
                ("specversion", v) if v != "1.0" => return Err("specversion can only be \"1.0\"".into()),
                (_, Value::String(_) | Value::Bool(_)) => {}
                (_, Value::Number(n)) if n.is_i64() => {}
                _ => return Err(format!("set {name}: a string, a boolean or an integer")),
            }
        }
        // Required attributes survive: not removed, and not renamed away unless set again.
        for r in REQUIRED {
            let lost = spec.remove.iter().any(|a| a == r) || spec.rename.contains_key(r);
            if lost && !spec.set.contains_key(r) && !spec.rename.values().any(|n| n == r) {
                return Err(format!("{r} is required: it cannot be removed or renamed away"));
            }
        }
        let mut variables = Vec::with_capacity(spec.variables.len());
        for (name, path) in &spec.variables {
            if !valid_variable(name) {
                return Err(format!("variable {name:?}: letters, digits and _, not starting with a digit"));
            }
            variables.push((name.clone(), parse_path(path)?));
        }
        if let Some(t) = &spec.data {
            if t.to_string().len() > MAX_TEMPLATE {
                return Err(format!("the data template is over {MAX_TEMPLATE} bytes"));
            }
            let mut strings = Vec::new();
            template_strings(t, &mut strings);
            for s in strings {
                for r in references(s) {
                    let r = r?;
                    if !spec.variables.contains_key(r) {
                        return Err(format!("the template refers to ${{{r}}}, which is not a variable"));
                    }
                }
            }
        }
        Ok(Transformer { topic: topic.to_owned(), spec, variables })
    }

    /// Transforms `event` (a structured CloudEvent) in place. The data the template builds is
    /// at most `budget` bytes (400 beyond: a template can repeat a large variable).
    pub fn apply(&self, event: &mut Map<String, Value>, budget: usize) -> Result<(), String> {
        let values: Vec<(&str, Value)> = if self.spec.data.is_some() {
            let whole = Value::Object(std::mem::take(event));
            let v = self
                .variables
                .iter()
                .map(|(n, steps)| (n.as_str(), lookup(&whole, steps).cloned().unwrap_or(Value::Null)))
                .collect();
            let Value::Object(back) = whole else { unreachable!("put there above") };
            *event = back;
            v
        } else {
            Vec::new()
        };
        for (from, to) in &self.spec.rename {
            if let Some(v) = event.remove(from) {
                event.insert(to.clone(), v);
            }
        }
        for a in &self.spec.remove {
            event.remove(a);
        }
        for (a, v) in &self.spec.set {
            event.insert(a.clone(), v.clone());
        }
        if let Some(t) = &self.spec.data {
            let mut left = budget;
            let data = render(t, &values, &mut left)
                .ok_or_else(|| format!("the transformer of {} made data over {budget} bytes", self.topic))?;
            event.remove("data_base64");
            event.insert("data".into(), data);
        }
        Ok(())
    }
}

/// The template with its references replaced; `None` once the result would pass `left` bytes.
fn render(t: &Value, values: &[(&str, Value)], left: &mut usize) -> Option<Value> {
    let var = |name: &str| values.iter().find(|(n, _)| *n == name).map_or(&Value::Null, |(_, v)| v);
    let spend = |left: &mut usize, n: usize| left.checked_sub(n).map(|l| *left = l);
    Some(match t {
        Value::String(s) => {
            let mut refs = references(s).flatten();
            match (refs.next(), refs.next()) {
                (Some(name), None) if s.len() == name.len() + 3 => {
                    let v = var(name).clone();
                    spend(left, v.to_string().len())?;
                    v
                }
                (None, _) => {
                    spend(left, s.len())?;
                    Value::String(s.clone())
                }
                _ => {
                    let mut out = String::new();
                    let mut rest = s.as_str();
                    while let Some(start) = rest.find("${") {
                        let end = start + 2 + rest[start + 2..].find('}')?;
                        out.push_str(&rest[..start]);
                        match var(&rest[start + 2..end]) {
                            Value::String(v) => out.push_str(v),
                            Value::Null => {}
                            other => out.push_str(&other.to_string()),
                        }
                        rest = &rest[end + 1..];
                        if out.len() > *left {
                            return None;
                        }
                    }
                    out.push_str(rest);
                    spend(left, out.len())?;
                    Value::String(out)
                }
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| render(v, values, left)).collect::<Option<_>>()?),
        Value::Object(o) => {
            let mut m = Map::new();
            for (k, v) in o {
                spend(left, k.len())?;
                m.insert(k.clone(), render(v, values, left)?);
            }
            Value::Object(m)
        }
        other => {
            spend(left, other.to_string().len())?;
            other.clone()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> TransformSpec {
        serde_json::from_value(v).unwrap()
    }

    fn event() -> Map<String, Value> {
        let v = json!({"specversion": "1.0", "id": "1", "source": "/shop", "type": "order.created",
            "subject": "s", "legacy": "x", "data": {"order": {"id": 42, "items": ["a", "b"]}, "customer": "Ada"}});
        v.as_object().unwrap().clone()
    }

    #[test]
    fn attributes_are_renamed_removed_and_set_in_that_order() {
        let t = Transformer::new(
            "orders",
            spec(json!({"rename": {"subject": "orderref"}, "remove": ["legacy"], "set": {"type": "order.v2", "priority": 3}})),
        )
        .unwrap();
        let mut e = event();
        t.apply(&mut e, 1 << 20).unwrap();
        assert_eq!(e["orderref"], "s");
        assert!(!e.contains_key("subject") && !e.contains_key("legacy"));
        assert_eq!(e["type"], "order.v2");
        assert_eq!(e["priority"], 3);
        assert_eq!(e["data"]["customer"], "Ada", "data untouched without a template");
    }

    #[test]
    fn the_template_substitutes_on_the_tree_never_the_text() {
        let t = Transformer::new(
            "orders",
            spec(json!({
                "variables": {"id": "$.data.order.id", "who": "$.data.customer", "first": "$.data.order.items[0]",
                              "src": "$['source']", "missing": "$.data.nope"},
                "data": {"orderId": "${id}", "text": "order ${id} for ${who} (${first}) from ${src}${missing}", "n": 1}
            })),
        )
        .unwrap();
        let mut e = event();
        t.apply(&mut e, 1 << 20).unwrap();
        assert_eq!(e["data"], json!({"orderId": 42, "text": "order 42 for Ada (a) from /shop", "n": 1}));
        // A value full of JSON syntax stays a string: no structure can be injected.
        let mut e = event();
        e["data"]["customer"] = json!(r#"", "admin": true, "x": ""#);
        t.apply(&mut e, 1 << 20).unwrap();
        assert_eq!(e["data"].as_object().unwrap().len(), 3);
        assert!(e["data"]["text"].as_str().unwrap().contains(r#""admin": true"#));
    }

    #[test]
    fn a_template_cannot_outgrow_its_budget() {
        let t = Transformer::new(
            "orders",
            spec(json!({"variables": {"d": "$.data"}, "data": ["${d}", "${d}", "${d} ${d}", {"k": "${d}"}]})),
        )
        .unwrap();
        let mut e = event();
        e["data"] = json!("x".repeat(1000));
        assert!(t.apply(&mut e.clone(), 3000).is_err());
        assert!(t.apply(&mut e, 10_000).is_ok());
    }

    #[test]
    fn rules_that_could_break_an_event_are_refused() {
        for bad in [
            json!({}),
            json!({"remove": ["id"]}),
            json!({"rename": {"type": "kind"}}),
            json!({"set": {"specversion": "0.3"}}),
            json!({"set": {"Bad": "x"}}),
            json!({"set": {"data": "x"}}),
            json!({"set": {"x": {"nested": 1}}}),
            json!({"set": {"x": 1.5}}),
            json!({"variables": {"v": "data.x"}, "data": "${v}"}),
            json!({"variables": {"v": "$.a["}, "data": "${v}"}),
            json!({"data": "${undeclared}"}),
            json!({"variables": {"v": "$.a"}, "data": "${v"}),
            json!({"variables": {"1v": "$.a"}, "data": "x"}),
        ] {
            assert!(Transformer::new("t", spec(bad.clone())).is_err(), "{bad}");
        }
        // Renaming a required attribute is fine when another takes its place.
        assert!(Transformer::new("t", spec(json!({"rename": {"type": "origtype"}, "set": {"type": "new"}}))).is_ok());
        assert!(serde_json::from_value::<TransformSpec>(json!({"sett": {}})).is_err(), "unknown fields");
    }
}
