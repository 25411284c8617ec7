//! Hostile filters: every cost bounded, measured by counters (steps, bytes handed out by the
//! event), never by a clock.

use std::cell::Cell;

use super::{compile, Budget, Event, Value, Verdict, MAX_ARGS, MAX_BYTES, MAX_STEPS};

/// One big string attribute `x` (and `n`, an integer); counts the bytes it hands out, so the
/// bound on what an evaluation copies does not rest on the evaluator's own accounting.
struct Big {
    x: String,
    handed_out: Cell<u64>,
}

impl Big {
    fn new(x: String) -> Big {
        Big { x, handed_out: Cell::new(0) }
    }
}

impl Event for Big {
    fn attribute(&self, name: &str) -> Option<Value> {
        match name {
            "x" => {
                self.handed_out.set(self.handed_out.get() + self.x.len() as u64);
                Some(Value::Str(self.x.clone()))
            }
            "n" => Some(Value::Int(7)),
            _ => None,
        }
    }
}

/// Evaluates `text` against `ev`: (verdict, steps spent, bytes spent).
fn run(text: &str, ev: &Big) -> (Verdict, u64, u64) {
    let expr = compile(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let mut budget = Budget::PER_EVENT;
    let v = expr.verdict(ev, &mut budget);
    (v, MAX_STEPS - budget.steps, MAX_BYTES - budget.bytes)
}

/// Regression (hostile suite, issue 8): `LIKE '%aaa...b'` over 300 KB values held a shard 3.8 s
/// in a backtracking match. Literal pieces are now substring searches: linear, within budget.
#[test]
fn regression_like_over_300k_values_is_linear() {
    let n = 300_000;
    let ev = Big::new("a".repeat(n));
    let tail = format!("{}b", "a".repeat(1000));
    for (pattern, want) in [
        (format!("%{tail}"), Verdict::NoMatch),
        (format!("%{tail}%"), Verdict::NoMatch),
        (format!("{tail}%"), Verdict::NoMatch),
        (format!("%a%{tail}%a"), Verdict::NoMatch),
        ("%aaa%".to_string(), Verdict::Match),
        (format!("%{}", "a".repeat(1000)), Verdict::Match),
        (format!("a%{}%a", "a".repeat(1000)), Verdict::Match),
    ] {
        let (v, steps, _) = run(&format!("x LIKE '{pattern}'"), &ev);
        assert_eq!(v, want, "{pattern}");
        // A backtracking match walks ~n * pattern length = 3e8 steps here.
        assert!(steps <= 3 * (n + pattern.len()) as u64, "{pattern}: {steps} steps");
    }
    let ev = Big::new(format!("{}{tail}", "a".repeat(n)));
    assert_eq!(run(&format!("x LIKE '%{tail}'"), &ev).0, Verdict::Match);
    assert_eq!(run(&format!("x NOT LIKE '%{tail}'"), &ev).0, Verdict::NoMatch);
}

/// Pieces with `_` are tried at each position: n * m steps at worst, cut by the step budget.
#[test]
fn like_with_underscores_is_cut_by_the_step_budget() {
    let ev = Big::new("a".repeat(300_000));
    let pattern = format!("%{}b%", "a_".repeat(1000));
    let expr = compile(&format!("x LIKE '{pattern}'")).unwrap();
    let mut budget = Budget::PER_EVENT;
    let out = expr.evaluate_within(&ev, &mut budget);
    assert!(out.over_budget && budget.exhausted);
    assert_eq!(out.value, Value::Bool(false));
    // Stopped within one piece's worth of steps of the budget, not after ~6e8.
    assert!(budget.steps < 2001, "{} steps left", budget.steps);
    assert!(budget.bytes > MAX_BYTES - 400_000, "no string was produced but the value read");
    let (v, _, _) = run(&format!("x NOT LIKE '{pattern}'"), &ev);
    assert_eq!(v, Verdict::OverBudget, "NOT does not turn an unfinished evaluation into a match");
    // The same shape on a short value is an ordinary match.
    let ev = Big::new(format!("{}b", "ab".repeat(1000)));
    assert_eq!(run(&format!("x LIKE '{pattern}'"), &ev).0, Verdict::Match);
}

/// Regression (hostile suite, issue 8): `length(concat(x, x, ...)) > 0` over one 400 KB
/// attribute grew the broker by 1.55 GB. Bytes read and produced now stop at the byte budget.
#[test]
fn regression_concat_chain_is_cut_by_the_byte_budget() {
    let big = 400_000u64;
    let ev = Big::new("y".repeat(big as usize));
    let args = vec!["x"; MAX_ARGS].join(", ");
    for text in [
        format!("length(concat({args})) > 0"),
        format!("length(concat_ws(x, {})) > 0", vec!["x"; MAX_ARGS - 1].join(", ")),
        "length(concat(concat(x, x), concat(x, x), concat(x, x))) > 0".to_string(),
        vec!["length(x)"; 60].join(" + ") + " > 0",
        "length(upper(lower(upper(lower(concat(x, x)))))) > 0".to_string(),
        format!("x IN ({args})"),
    ] {
        let before = ev.handed_out.get();
        let (v, _, bytes) = run(&text, &ev);
        assert_eq!(v, Verdict::OverBudget, "{text}");
        assert!(bytes <= MAX_BYTES, "{text}: {bytes} bytes");
        // What the event copied out: at most the budget plus the one read that crossed it.
        let read = ev.handed_out.get() - before;
        assert!(read <= MAX_BYTES + big, "{text}: {read} bytes read");
    }
    // Within the budget, the same functions simply work.
    assert_eq!(run("length(concat(x, x)) = 800000", &ev).0, Verdict::Match);
    assert_eq!(run("length(upper(x)) = 400000 AND left(x, 3) = 'yyy'", &ev).0, Verdict::Match);
}

/// The budget admits what a real filter does on the largest event: read a 1 MiB attribute and
/// search it once.
#[test]
fn linear_filters_fit_the_budget_on_the_largest_event() {
    let ev = Big::new(format!("{}needle", "a".repeat((1 << 20) - 16)));
    let (v, steps, bytes) = run("x LIKE '%needle%' AND length(x) > 1000 AND n = 7", &ev);
    assert_eq!(v, Verdict::Match);
    assert!(steps < MAX_STEPS && bytes < MAX_BYTES);
}

#[test]
fn chains_and_argument_lists_count_toward_the_limits() {
    let ev = Big::new(String::new());
    let ok = format!("1{} = 61", "+1".repeat(60));
    assert_eq!(run(&ok, &ev).0, Verdict::Match);
    for (text, want) in [
        (format!("1{} = 1", "+1".repeat(100)), "nested deeper than 64"),
        (format!("n{} = 1", " * n".repeat(100)), "nested deeper than 64"),
        (format!("n{} = 1", " = n".repeat(100)), "nested deeper than 64"),
        (format!("concat({})", vec!["x"; MAX_ARGS + 1].join(",")), "at most 64 arguments"),
        (format!("x IN ({})", vec!["1"; 1100].join(",")), "longer than 2048 tokens"),
        ("(".repeat(100_000), "tokens"),
    ] {
        match compile(&text) {
            Err(e) => assert!(e.message.contains(want), "{}: {e}", &text[..40.min(text.len())]),
            Ok(_) => panic!("{} accepted", &text[..40.min(text.len())]),
        }
    }
}

#[test]
fn a_shared_budget_spans_several_evaluations() {
    let ev = Big::new("z".repeat(1_000_000));
    let expr = compile("length(x) > 0").unwrap();
    let mut budget = Budget::PER_EVENT;
    assert_eq!(expr.verdict(&ev, &mut budget), Verdict::Match);
    assert_eq!(expr.verdict(&ev, &mut budget), Verdict::Match);
    assert_eq!(expr.verdict(&ev, &mut budget), Verdict::OverBudget, "the third walk of 1 MB passes the step budget");
    assert_eq!(expr.verdict(&Big::new(String::new()), &mut budget), Verdict::OverBudget, "exhausted stays");
}
