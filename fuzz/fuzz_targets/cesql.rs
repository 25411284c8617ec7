//! CESQL on arbitrary text: the parser and the evaluator never panic and never overflow the
//! stack, and an evaluation against a stored event stays within its budget: the string it
//! returns was paid for, and the heap it holds at its peak is bounded by the budget's bytes
//! (a small budget here, so the fuzzer reaches its edges; then the real per-event one).
#![no_main]

use evmesh_fuzz::{event, Counting};
use evmesh_protocol::subscription::cesql::{compile, Budget, Expr, Value};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The small budget: a few times the fixed event's long attribute.
const SMALL: Budget = Budget { steps: 1 << 16, bytes: 1 << 14, exhausted: false };

/// Heap an evaluation may hold beyond the bytes it paid for: values on the evaluation stack
/// (the tree is at most 64 high, calls take at most 64 arguments), vectors of arguments, and
/// growth slack of strings being built (at most twice what was paid).
const SLACK: usize = 256 * 1024;

fn check(expr: &Expr, budget: Budget) {
    let ev = event().body();
    let mut left = budget;
    let base = Counting::reset();
    let out = expr.evaluate_within(ev, &mut left);
    let held = Counting::peak() - base;
    let paid = (budget.bytes - left.bytes) as usize;
    if let Value::Str(s) = &out.value {
        assert!(s.len() <= paid, "returned {} bytes, paid for {paid}", s.len());
    }
    assert!(
        held <= 2 * budget.bytes as usize + SLACK,
        "held {held} bytes at peak with a budget of {} bytes ({paid} paid)",
        budget.bytes
    );
    assert_eq!(out.over_budget, left.exhausted);
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(expr) = compile(text) else { return };
    check(&expr, SMALL);
    check(&expr, Budget::PER_EVENT);
});
