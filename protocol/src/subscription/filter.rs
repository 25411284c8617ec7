//! Subscription filters: the CloudEvents Subscriptions API dialects `exact`, `prefix`, `suffix`,
//! `all`, `any`, `not` and `sql` (CESQL), compiled once per subscription from JSON and then
//! matched per event. A subscription's filter array is an AND of its entries.
//!
//! Matching runs on the shard that owns the partition, against the stored event in place, and
//! must never stall it: all the filters of a subscription share one [`Budget`] per event, every
//! dialect spends from it, and an event whose evaluation runs out does not match. Such events
//! are tallied per thread (read by `/metrics` per shard) and logged once per shard, so callers
//! keep calling [`matches_all`] and nothing else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use frame_codec::{ArchivedAttrValue, ArchivedFrameBody};
use serde_json::Value as Json;

use super::cesql::{self, Budget, Event, Expr, Value, Verdict};

/// A compiled filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Every (attribute, value) pair matches exactly.
    Exact(Vec<(String, String)>),
    /// Every named attribute is present and its value starts with the given string.
    Prefix(Vec<(String, String)>),
    /// Every named attribute is present and its value ends with the given string.
    Suffix(Vec<(String, String)>),
    /// Every nested filter matches (an empty list matches everything).
    All(Vec<Filter>),
    /// At least one nested filter matches (an empty list matches nothing).
    Any(Vec<Filter>),
    /// The nested filter does not match.
    Not(Box<Filter>),
    /// A CESQL expression: the event matches when it evaluates to boolean true.
    Sql(Box<Expr>),
}

/// Why a filter definition is refused (the client sees 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter {path}: {message}")]
pub struct FilterError {
    /// Where in the definition the fault is, as a JSON path (`filters[0].all[1].exact`).
    pub path: String,
    /// What is wrong there.
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

/// Every pair's attribute, as text, passes `test` against the wanted value: each lookup paid
/// for, the attribute's text borrowed, so comparing costs the wanted value's length at most.
fn pairs_verdict<E: Event + ?Sized>(
    pairs: &[(String, String)],
    ev: &E,
    budget: &mut Budget,
    test: fn(&str, &str) -> bool,
) -> Verdict {
    for (k, want) in pairs {
        if !budget.spend(ev.lookup_steps(), 0) {
            return Verdict::OverBudget;
        }
        if ev.attribute_text(k, &mut |got| test(got, want)) != Some(true) {
            return Verdict::NoMatch;
        }
    }
    Verdict::Match
}

impl Filter {
    /// Whether `ev` passes, spending from `budget`.
    pub fn verdict<E: Event + ?Sized>(&self, ev: &E, budget: &mut Budget) -> Verdict {
        if !budget.spend(1, 0) {
            return Verdict::OverBudget;
        }
        match self {
            Filter::Exact(p) => pairs_verdict(p, ev, budget, |got, want| got == want),
            Filter::Prefix(p) => pairs_verdict(p, ev, budget, |got, want| got.starts_with(want)),
            Filter::Suffix(p) => pairs_verdict(p, ev, budget, |got, want| got.ends_with(want)),
            Filter::All(fs) => all(fs, ev, budget),
            Filter::Any(fs) => {
                for f in fs {
                    match f.verdict(ev, budget) {
                        Verdict::NoMatch => {}
                        decided => return decided,
                    }
                }
                Verdict::NoMatch
            }
            Filter::Not(f) => match f.verdict(ev, budget) {
                Verdict::Match => Verdict::NoMatch,
                Verdict::NoMatch => Verdict::Match,
                Verdict::OverBudget => Verdict::OverBudget,
            },
            Filter::Sql(e) => e.verdict(ev, budget),
        }
    }

    /// Whether `ev` passes, within a fresh budget.
    pub fn matches<E: Event + ?Sized>(&self, ev: &E) -> bool {
        let mut budget = Budget::PER_EVENT;
        self.verdict(ev, &mut budget) == Verdict::Match
    }
}

fn all<E: Event + ?Sized>(filters: &[Filter], ev: &E, budget: &mut Budget) -> Verdict {
    for f in filters {
        match f.verdict(ev, budget) {
            Verdict::Match => {}
            decided => return decided,
        }
    }
    Verdict::Match
}

/// Whether `ev` passes every filter of a subscription, all of them within one
/// [`Budget::PER_EVENT`].
pub fn verdict_all<E: Event + ?Sized>(filters: &[Filter], ev: &E) -> Verdict {
    let mut budget = Budget::PER_EVENT;
    all(filters, ev, &mut budget)
}

/// Whether `ev` passes every filter of a subscription; an evaluation over budget does not
/// pass and is tallied for this thread (see [`over_budget_on`]).
pub fn matches_all<E: Event + ?Sized>(filters: &[Filter], ev: &E) -> bool {
    match verdict_all(filters, ev) {
        Verdict::Match => true,
        Verdict::NoMatch => false,
        Verdict::OverBudget => {
            note_over_budget();
            false
        }
    }
}

/// Each thread's tally of evaluations over budget, with the thread's name. A thread registers
/// on its first one (the lock is taken then and at scrape time only); filters run on shard
/// threads, so the hot path is a thread-local atomic add, and nothing at all while no filter
/// exceeds.
static OVER_BUDGET: Mutex<Vec<(String, Arc<AtomicU64>)>> = Mutex::new(Vec::new());

thread_local! {
    static OVER_BUDGET_HERE: Arc<AtomicU64> = {
        let tally = Arc::new(AtomicU64::new(0));
        let name = std::thread::current().name().unwrap_or("unnamed").to_owned();
        OVER_BUDGET.lock().unwrap_or_else(|e| e.into_inner()).push((name, tally.clone()));
        tally
    };
}

fn note_over_budget() {
    OVER_BUDGET_HERE.with(|tally| {
        if tally.fetch_add(1, Ordering::Relaxed) == 0 {
            let thread = std::thread::current();
            eprintln!(
                "evmesh: {}: a subscription filter ran out of its evaluation budget ({} steps, {} bytes per event); \
                 such events do not match. Further ones on this thread are only counted \
                 (evmesh_filter_budget_exceeded_total).",
                thread.name().unwrap_or("unnamed"),
                cesql::MAX_STEPS,
                cesql::MAX_BYTES,
            );
        }
    });
}

/// How many filter evaluations ran out of budget on the threads named `thread`.
pub fn over_budget_on(thread: &str) -> u64 {
    let tallies = OVER_BUDGET.lock().unwrap_or_else(|e| e.into_inner());
    tallies.iter().filter(|(n, _)| n == thread).map(|(_, t)| t.load(Ordering::Relaxed)).sum()
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

    fn lookup_steps(&self) -> usize {
        self.attributes.len().max(1)
    }

    fn has_attribute(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    fn attribute_text(&self, name: &str, test: &mut dyn FnMut(&str) -> bool) -> Option<bool> {
        Some(match self.attr(name)? {
            ArchivedAttrValue::Str(s) => test(s.as_str()),
            ArchivedAttrValue::Bool(b) => test(if *b { "true" } else { "false" }),
            ArchivedAttrValue::Int(i) => test(&i32::try_from(i.to_native()).unwrap_or(0).to_string()),
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

    /// A filter that runs out of budget does not match, under `not` and `any` too, and is
    /// tallied for the thread that evaluated it (what `/metrics` reads per shard).
    #[test]
    fn over_budget_never_matches_and_is_tallied() {
        let big = "y".repeat(400_000);
        let f = frame(&[("type", AttrValue::Str("t".into())), ("x", AttrValue::Str(big))]);
        let ev = f.body();
        let hostile = format!("length(concat({})) > 0", vec!["x"; 64].join(","));
        let thread = std::thread::current().name().unwrap().to_owned();
        let before = over_budget_on(&thread);
        for (filters, want) in [
            (json!([{"sql": hostile}]), Verdict::OverBudget),
            (json!([{"not": {"sql": hostile}}]), Verdict::OverBudget),
            (json!([{"any": [{"sql": hostile}, {"exact": {"type": "t"}}]}]), Verdict::OverBudget),
            (json!([{"any": [{"exact": {"type": "t"}}, {"sql": hostile}]}]), Verdict::Match),
            (json!([{"exact": {"type": "u"}}, {"sql": hostile}]), Verdict::NoMatch),
            (json!([{"sql": "length(x) = 400000"}, {"sql": "length(x) = 400000"}]), Verdict::Match),
            (json!([{"suffix": {"x": "yyy"}}, {"prefix": {"x": "yy"}}, {"exact": {"x": "y"}}]), Verdict::NoMatch),
        ] {
            let fs = compile(Some(&filters)).unwrap();
            assert_eq!(verdict_all(&fs, ev), want, "{filters}");
            assert_eq!(matches_all(&fs, ev), want == Verdict::Match, "{filters}");
        }
        assert_eq!(over_budget_on(&thread) - before, 3, "matches_all tallies each over-budget verdict");
        // All the filters of a subscription share one budget: 7 walks of 400 KB pass its steps.
        let fs = compile(Some(&json!(vec![json!({"sql": "length(x) > 0"}); 7]))).unwrap();
        assert_eq!(verdict_all(&fs, ev), Verdict::OverBudget);
        assert_eq!(verdict_all(&fs[..6], ev), Verdict::Match);
    }

    /// Lookups by name scan the event's attributes, so they are paid for by that length: many
    /// filters naming many attributes of a 1000-attribute event stop at the step budget.
    #[test]
    fn lookups_are_paid_for_by_the_attributes_they_scan() {
        let names: Vec<String> = (0..1000).map(|i| format!("a{i}")).collect();
        let attrs: Vec<(&str, AttrValue)> = names.iter().map(|n| (n.as_str(), AttrValue::Str("v".into()))).collect();
        let f = frame(&attrs);
        let pairs: serde_json::Map<String, Json> = names.iter().map(|n| (n.clone(), json!("v"))).collect();
        let one = json!([{"exact": pairs}]);
        assert_eq!(verdict_all(&compile(Some(&one)).unwrap(), f.body()), Verdict::Match);
        let many = json!(vec![json!({"exact": pairs}); 10]);
        assert_eq!(verdict_all(&compile(Some(&many)).unwrap(), f.body()), Verdict::OverBudget);
        let sql = json!([{"sql": vec!["EXISTS a999"; 30].join(" AND ")}]);
        assert_eq!(verdict_all(&compile(Some(&sql)).unwrap(), f.body()), Verdict::Match);
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
