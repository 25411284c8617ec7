//! Subscriptions API filters on arbitrary JSON: compiling never panics, and matching a stored
//! event never panics and stays within the budget: the same bound on held heap as the CESQL
//! target, with a small budget and then the real per-event one.
#![no_main]

use evmesh_fuzz::{event, Counting};
use evmesh_protocol::subscription::cesql::{Budget, Verdict};
use evmesh_protocol::subscription::filter::{compile, verdict_all, Filter};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: Counting = Counting;

const SMALL: Budget = Budget { steps: 1 << 16, bytes: 1 << 14, exhausted: false };
const SLACK: usize = 256 * 1024;

fn check(filters: &[Filter], budget: Budget) -> Verdict {
    let ev = event().body();
    let mut left = budget;
    let base = Counting::reset();
    let mut verdict = Verdict::Match;
    for f in filters {
        verdict = f.verdict(ev, &mut left);
        if verdict != Verdict::Match {
            break;
        }
    }
    let held = Counting::peak() - base;
    assert!(held <= 2 * budget.bytes as usize + SLACK, "held {held} bytes at peak with a budget of {}", budget.bytes);
    assert_eq!(verdict == Verdict::OverBudget, left.exhausted);
    verdict
}

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let Ok(filters) = compile(Some(&json)) else { return };
    check(&filters, SMALL);
    assert_eq!(check(&filters, Budget::PER_EVENT), verdict_all(&filters, event().body()));
});
