//! Subscription filters: the CloudEvents Subscriptions API dialects `exact`, `prefix`, `suffix`,
//! `all`, `any`, `not` and `sql` (CESQL), compiled once per subscription from JSON and then
//! matched per event. A subscription's filter array is an AND of its entries.

use frame_codec::{ArchivedAttrValue, ArchivedFrameBody};
use serde_json::Value as Json;

use super::cesql::{self, Event, Expr, Value};

/// A compiled filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Every (attribute, value) pair matches exactly.
    Exact(Vec<(String, String)>),
    Prefix(Vec<(String, String)>),
    Suffix(Vec<(String, String)>),
    All(Vec<Filter>),
    Any(Vec<Filter>),
    Not(Box<Filter>),
    Sql(Box<Expr>),
}

/// Why a filter definition is refused (the client sees 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter {path}: {message}")]
pub struct FilterError {
    pub path: String,
    pub message: String,
}

/// Deepest nesting of all/any/not accepted.
const MAX_DEPTH: usize = 32;

fn err(path: &str, message: impl Into<String>) -> FilterError {
    FilterError { path: path.to_owned(), message: message.into() }
}

fn pairs(path: &str, v: &Json) -> Result<Vec<(String, String)>, FilterError> {
    let obj = v.as_object().ok_or_else(|| err(path, "must be an object of attribute names to string values"))?;
    if obj.is_empty() {
        return Err(err(path, "names no attribute"));
    }
    obj.iter()
        .map(|(k, v)| {
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
                return Err(err(path, format!("{k:?} is not a CloudEvents attribute name ([a-z0-9]+)")));
            }
            let v = v.as_str().ok_or_else(|| err(path, format!("the value of {k} must be a string")))?;
            Ok((k.clone(), v.to_owned()))
        })
        .collect()
}

fn compile_at(path: &str, v: &Json, depth: usize) -> Result<Filter, FilterError> {
    if depth > MAX_DEPTH {
        return Err(err(path, format!("nested deeper than {MAX_DEPTH}")));
    }
    let obj = v.as_object().ok_or_else(|| err(path, "must be an object with one dialect"))?;
    let mut it = obj.iter();
    let (Some((dialect, arg)), None) = (it.next(), it.next()) else {
        return Err(err(path, "must name exactly one dialect (exact, prefix, suffix, all, any, not, sql)"));
    };
    let here = format!("{path}.{dialect}");
    let list = |arg: &Json| -> Result<Vec<Filter>, FilterError> {
        let items = arg.as_array().ok_or_else(|| err(&here, "must be an array of filters"))?;
        items.iter().enumerate().map(|(i, f)| compile_at(&format!("{here}[{i}]"), f, depth + 1)).collect()
    };
    Ok(match dialect.as_str() {
        "exact" => Filter::Exact(pairs(&here, arg)?),
        "prefix" => Filter::Prefix(pairs(&here, arg)?),
        "suffix" => Filter::Suffix(pairs(&here, arg)?),
        "all" => Filter::All(list(arg)?),
        "any" => Filter::Any(list(arg)?),
        "not" => Filter::Not(Box::new(compile_at(&here, arg, depth + 1)?)),
        "sql" => {
            let text = arg.as_str().ok_or_else(|| err(&here, "must be a CESQL expression string"))?;
            if text.len() > 4096 {
                return Err(err(&here, "expression longer than 4096 bytes"));
            }
            let expr = cesql::compile(text).map_err(|e| err(&here, e.to_string()))?;
            Filter::Sql(Box::new(expr))
        }
        other => return Err(err(path, format!("unknown dialect {other:?}"))),
    })
}

/// Compiles a subscription's `filters` array (absent or empty: everything matches).
pub fn compile(filters: Option<&Json>) -> Result<Vec<Filter>, FilterError> {
    match filters {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => {
            items.iter().enumerate().map(|(i, f)| compile_at(&format!("filters[{i}]"), f, 0)).collect()
        }
        Some(_) => Err(err("filters", "must be an array")),
    }
}

fn text_of(v: Value) -> String {
    match v {
        Value::Str(s) => s,
        Value::Int(i) => i.to_string(),
        Value::Bool(b) => b.to_string(),
    }
}

impl Filter {
    pub fn matches<E: Event + ?Sized>(&self, ev: &E) -> bool {
        let each = |pairs: &[(String, String)], test: fn(&str, &str) -> bool| {
            pairs.iter().all(|(k, want)| ev.attribute(k).map(text_of).is_some_and(|got| test(&got, want)))
        };
        match self {
            Filter::Exact(p) => each(p, |got, want| got == want),
            Filter::Prefix(p) => each(p, |got, want| got.starts_with(want)),
            Filter::Suffix(p) => each(p, |got, want| got.ends_with(want)),
            Filter::All(fs) => fs.iter().all(|f| f.matches(ev)),
            Filter::Any(fs) => fs.iter().any(|f| f.matches(ev)),
            Filter::Not(f) => !f.matches(ev),
            Filter::Sql(e) => e.matches(ev),
        }
    }
}

/// Whether `ev` passes every filter of a subscription.
pub fn matches_all<E: Event + ?Sized>(filters: &[Filter], ev: &E) -> bool {
    filters.iter().all(|f| f.matches(ev))
}

/// Stored events are read where they lie: attributes straight from the archived frame body.
impl Event for ArchivedFrameBody {
    fn attribute(&self, name: &str) -> Option<Value> {
        Some(match self.attr(name)? {
            ArchivedAttrValue::Str(s) => Value::Str(s.as_str().to_owned()),
            ArchivedAttrValue::Bool(b) => Value::Bool(*b),
            ArchivedAttrValue::Int(i) => Value::Int(i32::try_from(i.to_native()).unwrap_or(0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};
    use serde_json::json;

    fn frame(attrs: &[(&str, AttrValue)]) -> Frame {
        let body = FrameBody {
            topic: "t".into(),
            attributes: attrs.iter().map(|(n, v)| Attribute { name: n.to_string(), value: v.clone() }).collect(),
            data: Vec::new(),
        };
        Frame::encode(&FrameHeader::event(DataKind::None), &body).unwrap()
    }

    #[test]
    fn every_dialect_matches_as_specified() {
        let f = frame(&[
            ("id", AttrValue::Str("1".into())),
            ("type", AttrValue::Str("com.shop.order.created".into())),
            ("source", AttrValue::Str("/shop/eu".into())),
            ("amount", AttrValue::Int(150)),
            ("vip", AttrValue::Bool(true)),
        ]);
        let ev = f.body();
        let check = |filters: Json, want: bool| {
            let fs = compile(Some(&filters)).unwrap_or_else(|e| panic!("{filters}: {e}"));
            assert_eq!(matches_all(&fs, ev), want, "{filters}");
        };
        check(json!([]), true);
        check(json!([{"exact": {"type": "com.shop.order.created"}}]), true);
        check(json!([{"exact": {"type": "com.shop.order"}}]), false);
        check(json!([{"exact": {"type": "com.shop.order.created", "source": "/shop/eu"}}]), true);
        check(json!([{"exact": {"vip": "true", "amount": "150"}}]), true);
        check(json!([{"exact": {"missing": "x"}}]), false);
        check(json!([{"prefix": {"type": "com.shop."}}]), true);
        check(json!([{"prefix": {"type": "com.other."}}]), false);
        check(json!([{"suffix": {"type": ".created"}}]), true);
        check(json!([{"suffix": {"type": ".deleted"}}]), false);
        check(json!([{"all": [{"prefix": {"type": "com."}}, {"suffix": {"source": "/eu"}}]}]), true);
        check(json!([{"all": [{"prefix": {"type": "com."}}, {"suffix": {"source": "/us"}}]}]), false);
        check(json!([{"any": [{"prefix": {"type": "org."}}, {"suffix": {"source": "/eu"}}]}]), true);
        check(json!([{"any": []}]), false);
        check(json!([{"not": {"exact": {"type": "x"}}}]), true);
        check(json!([{"sql": "amount > 100 AND vip"}]), true);
        check(json!([{"sql": "amount > 200"}]), false);
        check(json!([{"sql": "missing = 1"}]), false);
        // AND across the array.
        check(json!([{"prefix": {"type": "com.shop."}}, {"sql": "amount > 100"}]), true);
        check(json!([{"prefix": {"type": "com.shop."}}, {"sql": "amount > 1000"}]), false);
    }

    #[test]
    fn bad_definitions_are_refused_with_their_path() {
        let refuse = |filters: Json, want: &str| match compile(Some(&filters)) {
            Err(e) => assert!(e.to_string().contains(want), "{filters}: {e}"),
            Ok(_) => panic!("{filters} accepted"),
        };
        refuse(json!({"exact": {}}), "must be an array");
        refuse(json!([{"regex": {"type": "x"}}]), "unknown dialect");
        refuse(json!([{"exact": {"type": "x"}, "prefix": {"type": "y"}}]), "exactly one dialect");
        refuse(json!([{}]), "exactly one dialect");
        refuse(json!([{"exact": {}}]), "names no attribute");
        refuse(json!([{"exact": {"type": 5}}]), "must be a string");
        refuse(json!([{"exact": {"Type": "x"}}]), "[a-z0-9]+");
        refuse(json!([{"sql": "amount >"}]), "filters[0].sql");
        refuse(json!([{"sql": 5}]), "CESQL expression string");
        refuse(json!([{"all": {"exact": {"type": "x"}}}]), "array of filters");
        refuse(json!([{"not": [1]}]), "filters[0].not");
        let mut deep = json!({"exact": {"type": "x"}});
        for _ in 0..40 {
            deep = json!({"not": deep});
        }
        refuse(json!([deep]), "nested deeper");
    }
}
