//! The transformer: per-topic rules that reshape an event on its way in (after the ACL, before
//! the router and the log). Set, remove or rename attributes, and build `data` from a template
//! whose `${name}` variables are JSONPath expressions into the event as published.
//!
//! It works on the event's frame body: attributes change, `data` keeps its bytes unless the
//! template replaces it. The template is JSON, and substitution happens on its tree, never on
//! its text: a string that is exactly `"${name}"` becomes the variable's value (any JSON);
//! `${name}` inside a longer string is replaced by the value's text (a string as is, anything
//! else as JSON). A variable's value can therefore never add structure to the result. What the
//! rules make is checked with the CloudEvents rules every published event meets, so a
//! transformed event is a valid one or the publish is refused (400). Every rule is checked when
//! it is set: names, paths, references, sizes, that no required attribute can be lost, and the
//! rule applied to a minimal event.

use std::collections::BTreeMap;

use frame_codec::{AttrValue, Attribute, DataKind, FrameBody};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::adaptor::cloudevents;

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
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name != "data"
}

/// Names a rule may write: not evmesh's own (`em...`: delivery ids, dead-letter origins).
fn writable(name: &str) -> bool {
    !name.starts_with("em")
}

fn attr_value(v: &Value) -> Option<AttrValue> {
    match v {
        Value::String(s) => Some(AttrValue::Str(s.clone())),
        Value::Bool(b) => Some(AttrValue::Bool(*b)),
        // CloudEvents integers are 32-bit.
        Value::Number(n) => n.as_i64().filter(|i| i32::try_from(*i).is_ok()).map(AttrValue::Int),
        _ => None,
    }
}

fn json_value(v: &AttrValue) -> Value {
    match v {
        AttrValue::Str(s) => Value::String(s.clone()),
        AttrValue::Bool(b) => Value::Bool(*b),
        AttrValue::Int(n) => Value::from(*n),
    }
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
                return Err(format!("{a:?} is not an attribute name ([a-z0-9]{{1,64}}; data is the template's)"));
            }
        }
        for name in spec.set.keys().chain(spec.rename.values()) {
            if !writable(name) {
                return Err(format!("{name}: attributes starting with em are evmesh's own"));
            }
        }
        for (name, v) in &spec.set {
            match (name.as_str(), v) {
                ("partitionkey", Value::String(_)) => {}
                ("partitionkey", _) => return Err("partitionkey is a string".into()),
                (_, v) if attr_value(v).is_none() => {
                    return Err(format!("set {name}: a string, a boolean or an integer"))
                }
                _ => {}
            }
        }
        // Required attributes survive every event: never removed, and renamed away only when
        // `set` gives them again or another required one (always there) takes the name.
        for r in REQUIRED {
            if spec.remove.iter().any(|a| a == r) {
                return Err(format!("{r} is required: it cannot be removed"));
            }
            let refilled = spec.set.contains_key(r)
                || spec.rename.iter().any(|(from, to)| to == r && REQUIRED.contains(&from.as_str()));
            if spec.rename.contains_key(r) && !refilled {
                return Err(format!("{r} is required: it cannot be renamed away unless set again"));
            }
            let from_optional = spec.rename.iter().any(|(from, to)| to == r && !REQUIRED.contains(&from.as_str()));
            if from_optional && !spec.set.contains_key(r) {
                return Err(format!("{r} is required: an attribute an event may lack cannot be renamed to it"));
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
        let t = Transformer { topic: topic.to_owned(), spec, variables };
        // Last, the rule on a minimal event (plus what it renames): what it sets must pass the
        // CloudEvents checks (a source that is a number, an empty id, a time that is not one).
        let mut sample = FrameBody { topic: topic.to_owned(), attributes: Vec::new(), data: Vec::new() };
        let names = REQUIRED.iter().copied().chain(t.spec.rename.keys().map(String::as_str));
        for name in names {
            if !sample.attributes.iter().any(|a| a.name == name) {
                let value = AttrValue::Str(if name == "specversion" { "1.0".into() } else { "x".into() });
                sample.attributes.push(Attribute { name: name.to_owned(), value });
            }
        }
        let mut unlimited = usize::MAX;
        t.apply(&mut sample, DataKind::None, &mut unlimited)
            .map_err(|e| format!("applied to a minimal event, the rule makes an invalid one: {e}"))?;
        Ok(t)
    }

    /// Transforms an event's body in place; returns the kind of its data afterwards. The data
    /// a template builds is taken from `budget` (the request's; 400 once it is spent: a template
    /// can repeat a large variable). The result meets the CloudEvents checks, or this says why.
    pub fn apply(&self, body: &mut FrameBody, kind: DataKind, budget: &mut usize) -> Result<DataKind, String> {
        let values: Vec<(&str, Value)> = match &self.spec.data {
            Some(_) => {
                let event = EventView { body, kind, data: std::cell::OnceCell::new() };
                self.variables.iter().map(|(n, steps)| (n.as_str(), event.lookup(steps))).collect()
            }
            None => Vec::new(),
        };
        let attrs = &mut body.attributes;
        // Renames happen at once: {id: source, source: id} swaps them.
        let moved: Vec<(&String, AttrValue)> = self
            .spec
            .rename
            .iter()
            .filter_map(|(from, to)| {
                let i = attrs.iter().position(|a| a.name == *from)?;
                Some((to, attrs.swap_remove(i).value))
            })
            .collect();
        for (to, value) in moved {
            put(attrs, to, value);
        }
        attrs.retain(|a| !self.spec.remove.contains(&a.name));
        for (name, v) in &self.spec.set {
            put(attrs, name, attr_value(v).expect("checked when set"));
        }
        let mut kind = kind;
        if let Some(t) = &self.spec.data {
            let data = render(t, &values, budget)
                .ok_or_else(|| format!("the transformer of {} made data over the request's budget", self.topic))?;
            body.data = serde_json::to_vec(&data).expect("a JSON value serializes");
            kind = DataKind::Json;
            if !self.spec.set.contains_key("datacontenttype") {
                put(&mut body.attributes, "datacontenttype", AttrValue::Str("application/json".into()));
            }
        }
        cloudevents::check_event(&body.attributes).map_err(|e| match e {
            cloudevents::CeError::Invalid(m) | cloudevents::CeError::UnsupportedMedia(m) => m,
        })?;
        Ok(kind)
    }
}

fn put(attrs: &mut Vec<Attribute>, name: &str, value: AttrValue) {
    match attrs.iter_mut().find(|a| a.name == name) {
        Some(a) => a.value = value,
        None => attrs.push(Attribute { name: name.to_owned(), value }),
    }
}

/// The event as JSONPath sees it: its attributes, and `data` (parsed once, if a path asks).
struct EventView<'b> {
    body: &'b FrameBody,
    kind: DataKind,
    data: std::cell::OnceCell<Value>,
}

impl EventView<'_> {
    fn lookup(&self, steps: &[Step]) -> Value {
        let (first, rest) = match steps.split_first() {
            Some((Step::Key(k), rest)) => (k.as_str(), rest),
            // `$` alone, or `$[0]`: the whole event is not a variable.
            _ => return Value::Null,
        };
        let root = if first == "data" {
            self.data.get_or_init(|| match self.kind {
                DataKind::Json => serde_json::from_slice(&self.body.data).unwrap_or(Value::Null),
                DataKind::Text => Value::String(String::from_utf8_lossy(&self.body.data).into_owned()),
                DataKind::None | DataKind::Binary => Value::Null,
            })
        } else {
            match self.body.attributes.iter().find(|a| a.name == first) {
                Some(a) if rest.is_empty() => return json_value(&a.value),
                _ => return Value::Null,
            }
        };
        lookup(root, rest).cloned().unwrap_or(Value::Null)
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

    fn event() -> FrameBody {
        let v = json!({"specversion": "1.0", "id": "1", "source": "/shop", "type": "order.created",
            "subject": "s", "legacy": "x", "data": {"order": {"id": 42, "items": ["a", "b"]}, "customer": "Ada"}});
        cloudevents::parse_structured("orders", v.to_string().as_bytes()).unwrap().to_body()
    }

    fn attr<'a>(b: &'a FrameBody, name: &str) -> Option<&'a AttrValue> {
        b.attributes.iter().find(|a| a.name == name).map(|a| &a.value)
    }

    fn data(b: &FrameBody) -> Value {
        serde_json::from_slice(&b.data).unwrap()
    }

    #[test]
    fn attributes_are_renamed_removed_and_set_and_data_keeps_its_bytes() {
        let t = Transformer::new(
            "orders",
            spec(json!({"rename": {"subject": "orderref"}, "remove": ["legacy"], "set": {"type": "order.v2", "priority": 3}})),
        )
        .unwrap();
        let mut e = event();
        let before = e.data.clone();
        assert_eq!(t.apply(&mut e, DataKind::Json, &mut 1_000_000).unwrap(), DataKind::Json);
        assert_eq!(attr(&e, "orderref"), Some(&AttrValue::Str("s".into())));
        assert!(attr(&e, "subject").is_none() && attr(&e, "legacy").is_none());
        assert_eq!(attr(&e, "type"), Some(&AttrValue::Str("order.v2".into())));
        assert_eq!(attr(&e, "priority"), Some(&AttrValue::Int(3)));
        assert_eq!(e.data, before, "data untouched, byte for byte, without a template");
        // Renames happen at once.
        let swap = Transformer::new("o", spec(json!({"rename": {"id": "source", "source": "id"}}))).unwrap();
        let mut e = event();
        swap.apply(&mut e, DataKind::Json, &mut 1_000_000).unwrap();
        assert_eq!(attr(&e, "id"), Some(&AttrValue::Str("/shop".into())));
        assert_eq!(attr(&e, "source"), Some(&AttrValue::Str("1".into())));
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
        t.apply(&mut e, DataKind::Json, &mut 1_000_000).unwrap();
        assert_eq!(data(&e), json!({"orderId": 42, "text": "order 42 for Ada (a) from /shop", "n": 1}));
        assert_eq!(attr(&e, "datacontenttype"), Some(&AttrValue::Str("application/json".into())));
        // A value full of JSON syntax stays a string: no structure can be injected.
        let v = json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t",
            "data": {"order": {"id": 1}, "customer": "\", \"admin\": true, \"x\": \""}});
        let mut e = cloudevents::parse_structured("orders", v.to_string().as_bytes()).unwrap().to_body();
        t.apply(&mut e, DataKind::Json, &mut 1_000_000).unwrap();
        assert_eq!(data(&e).as_object().unwrap().len(), 3);
        assert!(data(&e)["text"].as_str().unwrap().contains(r#""admin": true"#));
        // Data that is not JSON gives null variables, not a failure.
        let mut e = event();
        e.data = b"not json".to_vec();
        t.apply(&mut e, DataKind::Json, &mut 1_000_000).unwrap();
        assert_eq!(data(&e)["orderId"], Value::Null);
    }

    #[test]
    fn a_template_cannot_outgrow_the_request_budget() {
        let t = Transformer::new(
            "orders",
            spec(json!({"variables": {"d": "$.data"}, "data": ["${d}", "${d}", "${d} ${d}", {"k": "${d}"}]})),
        )
        .unwrap();
        let mut e = event();
        e.data = serde_json::to_vec(&json!("x".repeat(1000))).unwrap();
        assert!(t.apply(&mut e.clone(), DataKind::Json, &mut 3000).is_err());
        // The budget is the request's: what one event took, the next cannot.
        let mut budget = 10_000;
        assert!(t.apply(&mut e.clone(), DataKind::Json, &mut budget).is_ok());
        assert!(t.apply(&mut e, DataKind::Json, &mut budget).is_err());
    }

    #[test]
    fn rules_that_could_break_an_event_are_refused() {
        for bad in [
            json!({}),
            json!({"remove": ["id"]}),
            json!({"rename": {"type": "kind"}}),
            json!({"rename": {"subject": "id"}, "remove": ["id"]}),
            json!({"rename": {"id": "origid", "subject": "id"}}),
            json!({"set": {"specversion": "0.3"}}),
            json!({"set": {"source": 5}}),
            json!({"set": {"id": ""}}),
            json!({"set": {"time": "now"}}),
            json!({"set": {"x": 4294967296u64}}),
            json!({"set": {"dataschema": "x"}}),
            json!({"set": {"partitionkey": 7}}),
            json!({"set": {"emdlqtopic": "x"}}),
            json!({"rename": {"subject": "emattempt"}}),
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
        // Renaming a required attribute is fine when it is set again.
        assert!(Transformer::new("t", spec(json!({"rename": {"type": "origtype"}, "set": {"type": "new"}}))).is_ok());
        assert!(serde_json::from_value::<TransformSpec>(json!({"sett": {}})).is_err(), "unknown fields");
    }
}
