//! Evaluating a compiled expression against one event.
//!
//! Errors never stop evaluation: the failing operation yields its type's zero value and the
//! first error is reported in the [`Outcome`]. A missing attribute makes the operation that uses
//! it yield its zero value without computing (so `missing / 0` is a missing-attribute error, not
//! a division by zero), as the TCK requires.
//!
//! Every evaluation spends from a [`Budget`] of steps and of bytes produced, checked before the
//! costly part of each operation where it can be. A filter that runs out stops at once and does
//! not match ([`Verdict::OverBudget`]): filters come from clients and run on the shard that owns
//! the partition, so no expression may cost more than the budget, whatever the event holds.
//! This module only reports it; callers count and log.

use super::parser::{BinOp, Expr, Function, Pattern, Piece};
use super::{ErrorKind, Value};

/// What an expression can read: the event's context attributes and extensions by name.
pub trait Event {
    /// The value of the attribute `name` (lower case) in its CESQL type, `None` if absent.
    fn attribute(&self, name: &str) -> Option<Value>;

    /// Steps one lookup by name costs, charged to the budget: how many attributes it may
    /// compare (a stored event scans its list, at most 1024 long).
    fn lookup_steps(&self) -> usize {
        1
    }

    /// Whether the attribute is present, without copying its value where the event can avoid it.
    fn has_attribute(&self, name: &str) -> bool {
        self.attribute(name).is_some()
    }

    /// `test` applied to the attribute's text form (integers and booleans as CESQL prints
    /// them), `None` when absent; events that hold the text lend it instead of copying it.
    fn attribute_text(&self, name: &str, test: &mut dyn FnMut(&str) -> bool) -> Option<bool> {
        self.attribute(name).map(|v| test(&string(v)))
    }
}

/// Steps one evaluation of a subscription's filters against one event may take: two linear
/// passes (a LIKE and a LENGTH, say) over the largest attribute an event can carry at the
/// default `max_body_bytes` (1 MiB), with a quarter as much again to spare. Spent in full, that
/// is one to two milliseconds of one core: the publish that pays for it waits in its shard's
/// heavy lane, and a light request on the same core waits behind about one such request.
pub const MAX_STEPS: u64 = 5 << 19;

/// Bytes of strings one evaluation may produce (attribute values read, literals, function
/// results): room to read the largest attribute four times at the default `max_body_bytes`,
/// and with it a bound on the memory one evaluation holds.
pub const MAX_BYTES: u64 = 4 << 20;

/// What is left to spend; shared by every filter of a subscription for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// One per node evaluated, per attribute a lookup by name may compare, per character a LIKE
    /// or a string function walks, per set member compared.
    pub steps: u64,
    /// One per byte of string produced.
    pub bytes: u64,
    /// Set by the first spend that did not fit; every later spend fails too.
    pub exhausted: bool,
}

impl Budget {
    /// The budget of one event's evaluation: [`MAX_STEPS`] and [`MAX_BYTES`].
    pub const PER_EVENT: Budget = Budget { steps: MAX_STEPS, bytes: MAX_BYTES, exhausted: false };

    /// Takes `steps` and `bytes` if both fit; otherwise takes nothing and is exhausted.
    pub fn spend(&mut self, steps: usize, bytes: usize) -> bool {
        let (steps, bytes) = (steps as u64, bytes as u64);
        if self.exhausted || steps > self.steps || bytes > self.bytes {
            self.exhausted = true;
            return false;
        }
        self.steps -= steps;
        self.bytes -= bytes;
        true
    }
}

/// Whether an event passes a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The event passes.
    Match,
    /// The event does not pass.
    NoMatch,
    /// The evaluation ran out of budget and stopped: the event does not match.
    OverBudget,
}

/// The result of one evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `false` when over budget.
    pub value: Value,
    /// The first error met, if any.
    pub error: Option<ErrorKind>,
    /// Whether the budget ran out (the value is then `false`, whatever was computed).
    pub over_budget: bool,
}

/// The result of evaluating one node.
enum Res {
    Ok(Value),
    /// Computed, but an error was raised on the way.
    Err(Value),
    /// A missing attribute: no value at all.
    Missing,
}

struct Ctx<'e, 'b, E: Event + ?Sized> {
    event: &'e E,
    error: Option<ErrorKind>,
    /// How many errors were raised so far (only the first is reported).
    raised: usize,
    budget: &'b mut Budget,
}

impl<E: Event + ?Sized> Ctx<'_, '_, E> {
    fn spend(&mut self, steps: usize, bytes: usize) -> bool {
        self.budget.spend(steps, bytes)
    }

    fn fail(&mut self, kind: ErrorKind) {
        self.error.get_or_insert(kind);
        self.raised += 1;
    }

    fn int(&mut self, v: Value) -> i32 {
        match v {
            Value::Int(i) => i,
            Value::Bool(b) => i32::from(b),
            Value::Str(s) => {
                if !self.spend(s.len(), 0) {
                    return 0;
                }
                s.parse().unwrap_or_else(|_| {
                    self.fail(ErrorKind::Cast);
                    0
                })
            }
        }
    }

    /// Implicit boolean cast: integers do not convert implicitly.
    fn bool(&mut self, v: Value) -> bool {
        match v {
            Value::Bool(b) => b,
            Value::Str(s) if s.eq_ignore_ascii_case("true") => true,
            Value::Str(s) if s.eq_ignore_ascii_case("false") => false,
            _ => {
                self.fail(ErrorKind::Cast);
                false
            }
        }
    }

    fn cast_like(&mut self, v: Value, like: &Value) -> Value {
        match like {
            Value::Bool(_) => Value::Bool(self.bool(v)),
            Value::Int(_) => Value::Int(self.int(v)),
            Value::Str(_) => Value::Str(self.text(v)),
        }
    }

    /// The text form of a value, its bytes spent when it had to be printed.
    fn text(&mut self, v: Value) -> String {
        match v {
            Value::Str(s) => s,
            v => {
                let s = string(v);
                self.spend(0, s.len());
                s
            }
        }
    }

    /// Evaluates `e` within the budget: once it is exhausted every node yields "missing", so
    /// the operators above it compute nothing and evaluation unwinds at once.
    fn eval(&mut self, e: &Expr) -> Res {
        if !self.spend(1, 0) {
            return Res::Missing;
        }
        let r = self.eval_node(e);
        if self.budget.exhausted {
            return Res::Missing;
        }
        r
    }

    /// Evaluates `e`. An operand that errored (or is missing) makes its operator yield that
    /// operator's zero value, marked as errored too; the operator that raised an error keeps the
    /// value it computed with zero-valued inputs (so `NOT 10` is true with a cast error).
    fn eval_node(&mut self, e: &Expr) -> Res {
        match e {
            Expr::Lit(v) => {
                if let Value::Str(s) = v {
                    self.spend(0, s.len());
                }
                Res::Ok(v.clone())
            }
            Expr::Attr(_) | Expr::Exists(_) if !self.spend(self.event.lookup_steps(), 0) => Res::Missing,
            Expr::Attr(name) => match self.event.attribute(name) {
                Some(v) => {
                    if let Value::Str(s) = &v {
                        self.spend(0, s.len());
                    }
                    Res::Ok(v)
                }
                None => {
                    self.fail(ErrorKind::MissingAttribute);
                    Res::Missing
                }
            },
            Expr::Exists(name) => Res::Ok(Value::Bool(self.event.has_attribute(name))),
            Expr::Not(x) => {
                let Res::Ok(v) = self.eval(x) else { return Res::Err(Value::Bool(false)) };
                self.raising(|c| Value::Bool(!c.bool(v)))
            }
            Expr::Neg(x) => {
                let Res::Ok(v) = self.eval(x) else { return Res::Err(Value::Int(0)) };
                self.raising(|c| {
                    let i = c.int(v);
                    Value::Int(i.checked_neg().unwrap_or_else(|| {
                        c.fail(ErrorKind::Math);
                        0
                    }))
                })
            }
            Expr::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
                let short = *op == BinOp::Or;
                let Res::Ok(lv) = self.eval(l) else { return Res::Err(Value::Bool(false)) };
                let lb = match self.raising(|c| Value::Bool(c.bool(lv))) {
                    Res::Ok(Value::Bool(b)) => b,
                    _ => return Res::Err(Value::Bool(false)),
                };
                if lb == short {
                    return Res::Ok(Value::Bool(short));
                }
                let Res::Ok(rv) = self.eval(r) else { return Res::Err(Value::Bool(false)) };
                self.raising(|c| Value::Bool(c.bool(rv)))
            }
            Expr::Binary(op, l, r) => {
                let (lv, rv) = (self.eval(l), self.eval(r));
                let (Res::Ok(lv), Res::Ok(rv)) = (lv, rv) else { return Res::Err(zero_of(*op)) };
                self.raising(|c| c.binary(*op, lv, rv))
            }
            Expr::Like { expr, pattern, negated } => {
                let Res::Ok(v) = self.eval(expr) else { return Res::Err(Value::Bool(false)) };
                let s = self.text(v);
                Res::Ok(Value::Bool(self.like(&s, pattern) != *negated))
            }
            Expr::In { expr, set, negated } => {
                let Res::Ok(v) = self.eval(expr) else { return Res::Err(Value::Bool(false)) };
                let mut items = Vec::with_capacity(set.len());
                for item in set {
                    match self.eval(item) {
                        Res::Ok(x) => items.push(x),
                        _ => return Res::Err(Value::Bool(false)),
                    }
                }
                self.raising(|c| {
                    c.spend(items.len(), 0);
                    let found = items.into_iter().any(|x| c.cast_like(x, &v) == v);
                    Value::Bool(found != *negated)
                })
            }
            Expr::Call(f, args) => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    match self.eval(a) {
                        Res::Ok(v) => vals.push(v),
                        _ => return Res::Err(zero_of_fn(*f)),
                    }
                }
                self.raising(|c| c.call(*f, vals))
            }
            Expr::MissingFunction(_) => {
                self.fail(ErrorKind::MissingFunction);
                Res::Err(Value::Bool(false))
            }
        }
    }

    /// Runs one operator; if it raised an error, its value is marked as errored.
    fn raising(&mut self, op: impl FnOnce(&mut Self) -> Value) -> Res {
        let before = self.raised;
        let v = op(self);
        if self.raised > before {
            Res::Err(v)
        } else {
            Res::Ok(v)
        }
    }

    fn binary(&mut self, op: BinOp, l: Value, r: Value) -> Value {
        match op {
            BinOp::Xor => Value::Bool(self.bool(l) != self.bool(r)),
            BinOp::Eq | BinOp::NotEq => {
                // Mixed types: the left operand is cast to the right operand's type.
                let l =
                    if std::mem::discriminant(&l) == std::mem::discriminant(&r) { l } else { self.cast_like(l, &r) };
                Value::Bool((l == r) == (op == BinOp::Eq))
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let (a, b) = (self.int(l), self.int(r));
                Value::Bool(match op {
                    BinOp::Lt => a < b,
                    BinOp::Le => a <= b,
                    BinOp::Gt => a > b,
                    _ => a >= b,
                })
            }
            _ => {
                let (a, b) = (self.int(l), self.int(r));
                let v = match op {
                    BinOp::Add => a.checked_add(b),
                    BinOp::Sub => a.checked_sub(b),
                    BinOp::Mul => a.checked_mul(b),
                    BinOp::Div => a.checked_div(b),
                    _ => a.checked_rem(b),
                };
                Value::Int(v.unwrap_or_else(|| {
                    self.fail(ErrorKind::Math);
                    0
                }))
            }
        }
    }

    fn call(&mut self, f: Function, args: Vec<Value>) -> Value {
        let mut args = args.into_iter();
        macro_rules! next {
            () => {
                args.next().expect("arity checked at compile time")
            };
        }
        match f {
            Function::Int => Value::Int(self.int(next!())),
            Function::Bool => match next!() {
                Value::Int(i) => Value::Bool(i != 0),
                v => Value::Bool(self.bool(v)),
            },
            Function::String => Value::Str(self.text(next!())),
            Function::IsBool => Value::Bool(match next!() {
                Value::Bool(_) => true,
                Value::Str(s) => s.eq_ignore_ascii_case("true") || s.eq_ignore_ascii_case("false"),
                Value::Int(_) => false,
            }),
            Function::IsInt => Value::Bool(match next!() {
                Value::Int(_) => true,
                Value::Str(s) => s.parse::<i32>().is_ok(),
                Value::Bool(_) => false,
            }),
            Function::Abs => {
                let i = self.int(next!());
                Value::Int(i.checked_abs().unwrap_or_else(|| {
                    self.fail(ErrorKind::Math);
                    i32::MAX
                }))
            }
            Function::Length => {
                let s = string(next!());
                if !self.spend(s.len(), 0) {
                    return Value::Int(0);
                }
                Value::Int(s.chars().count().min(i32::MAX as usize) as i32)
            }
            Function::Lower | Function::Upper | Function::Trim => {
                let s = string(next!());
                if !self.spend(s.len(), 0) {
                    return Value::Str(String::new());
                }
                let out = match f {
                    Function::Lower => s.to_lowercase(),
                    Function::Upper => s.to_uppercase(),
                    _ => s.trim().to_owned(),
                };
                drop(s);
                self.produced(out)
            }
            Function::Concat | Function::ConcatWs => {
                let sep = if f == Function::ConcatWs { string(next!()) } else { String::new() };
                let parts: Vec<String> = args.by_ref().map(string).collect();
                // Sized and paid for before anything is copied.
                let len = parts.iter().map(String::len).sum::<usize>() + sep.len() * parts.len().saturating_sub(1);
                if !self.spend(parts.len(), len) {
                    return Value::Str(String::new());
                }
                Value::Str(parts.join(&sep))
            }
            Function::Left | Function::Right => {
                let mut s = string(next!());
                let n = self.int(next!());
                if n < 0 {
                    self.fail(ErrorKind::FunctionEvaluation);
                    return Value::Str(s);
                }
                let n = n as usize;
                if !self.spend(n.min(s.len()), 0) {
                    return Value::Str(String::new());
                }
                if f == Function::Left {
                    s.truncate(s.char_indices().nth(n).map_or(s.len(), |(i, _)| i));
                } else if n == 0 {
                    s.clear();
                } else {
                    s.drain(..s.char_indices().rev().nth(n - 1).map_or(0, |(i, _)| i));
                }
                Value::Str(s)
            }
            Function::Substring => {
                let mut s = string(next!());
                let pos = self.int(next!());
                let len = args.next().map(|v| self.int(v));
                if !self.spend(s.len(), 0) {
                    return Value::Str(String::new());
                }
                let n = s.chars().count() as i64;
                let pos = i64::from(pos);
                if pos == 0 {
                    return Value::Str(String::new());
                }
                if pos.abs() > n || len.is_some_and(|l| l < 0) {
                    self.fail(ErrorKind::FunctionEvaluation);
                    return Value::Str(String::new());
                }
                let start = if pos > 0 { pos - 1 } else { n + pos } as usize;
                let end = len.map_or(n as usize, |l| (start + l as usize).min(n as usize));
                let byte = |s: &str, k: usize| s.char_indices().nth(k).map_or(s.len(), |(i, _)| i);
                s.truncate(byte(&s, end));
                s.drain(..byte(&s, start));
                Value::Str(s)
            }
        }
    }

    /// A function's fresh string result, its bytes spent (the empty string when they do not fit).
    fn produced(&mut self, out: String) -> Value {
        if self.spend(0, out.len()) {
            Value::Str(out)
        } else {
            Value::Str(String::new())
        }
    }

    /// LIKE: the pattern's first piece at the start, its last at the end, and each piece between
    /// at its leftmost place after the previous one. Literal pieces are found by a linear-time
    /// substring search; pieces with `_` are tried at each position, which the step budget bounds.
    fn like(&mut self, s: &str, p: &Pattern) -> bool {
        let (first, rest) = p.pieces.split_first().expect("a pattern has a first piece");
        let Some(mut pos) = self.piece_at(s, 0, first) else { return false };
        if !p.percent {
            return pos == s.len();
        }
        let (last, middle) = rest.split_last().expect("a pattern with % has a last piece");
        let k = last.chars.len();
        if !self.spend(k, 0) {
            return false;
        }
        let tail = if k == 0 { Some(s.len()) } else { s.char_indices().rev().nth(k - 1).map(|(i, _)| i) };
        let Some(tail) = tail.filter(|&t| t >= pos) else { return false };
        if self.piece_at(s, tail, last) != Some(s.len()) {
            return false;
        }
        let head = &s[..tail];
        for piece in middle {
            match self.find(head, pos, piece) {
                Some(end) => pos = end,
                None => return false,
            }
        }
        true
    }

    /// Where `piece` ends if it matches `s` at byte `at`.
    fn piece_at(&mut self, s: &str, at: usize, piece: &Piece) -> Option<usize> {
        if !self.spend(piece.chars.len(), 0) {
            return None;
        }
        if let Some(lit) = &piece.literal {
            return s[at..].starts_with(lit.as_str()).then_some(at + lit.len());
        }
        let mut rest = s[at..].chars();
        for want in &piece.chars {
            let c = rest.next()?;
            if want.is_some_and(|w| w != c) {
                return None;
            }
        }
        Some(s.len() - rest.as_str().len())
    }

    /// Where the leftmost match of `piece` in `s` at or after byte `from` ends.
    fn find(&mut self, s: &str, from: usize, piece: &Piece) -> Option<usize> {
        if let Some(lit) = &piece.literal {
            let found = s[from..].find(lit.as_str()).map(|i| from + i + lit.len());
            // Two-way search: its work is linear in what it walked.
            return self.spend(found.unwrap_or(s.len()) - from, 0).then_some(found).flatten();
        }
        let mut at = from;
        loop {
            if let Some(end) = self.piece_at(s, at, piece) {
                return Some(end);
            }
            if self.budget.exhausted {
                return None;
            }
            at += s[at..].chars().next()?.len_utf8();
        }
    }
}

fn string(v: Value) -> String {
    match v {
        Value::Str(s) => s,
        Value::Int(i) => i.to_string(),
        Value::Bool(b) => b.to_string(),
    }
}

fn zero_of(op: BinOp) -> Value {
    match op {
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod => Value::Int(0),
        _ => Value::Bool(false),
    }
}

fn zero_of_fn(f: Function) -> Value {
    match f {
        Function::Int | Function::Abs | Function::Length => Value::Int(0),
        Function::Bool | Function::IsBool | Function::IsInt => Value::Bool(false),
        _ => Value::Str(String::new()),
    }
}

impl Expr {
    /// Evaluates against `event` within a fresh [`Budget::PER_EVENT`]; never fails (see the
    /// module docs).
    pub fn evaluate<E: Event + ?Sized>(&self, event: &E) -> Outcome {
        let mut budget = Budget::PER_EVENT;
        self.evaluate_within(event, &mut budget)
    }

    /// Evaluates against `event`, spending from `budget`.
    pub fn evaluate_within<E: Event + ?Sized>(&self, event: &E, budget: &mut Budget) -> Outcome {
        let mut ctx = Ctx { event, error: None, raised: 0, budget };
        let value = match ctx.eval(self) {
            Res::Ok(v) | Res::Err(v) => v,
            Res::Missing => Value::Bool(false),
        };
        let over_budget = ctx.budget.exhausted;
        let value = if over_budget { Value::Bool(false) } else { value };
        Outcome { value, error: ctx.error, over_budget }
    }

    /// Whether `event` passes this filter (the expression is exactly boolean true), spending
    /// from `budget`.
    pub fn verdict<E: Event + ?Sized>(&self, event: &E, budget: &mut Budget) -> Verdict {
        let out = self.evaluate_within(event, budget);
        match out.value {
            _ if out.over_budget => Verdict::OverBudget,
            Value::Bool(true) => Verdict::Match,
            _ => Verdict::NoMatch,
        }
    }

    /// Whether `event` passes this filter within a fresh budget.
    pub fn matches<E: Event + ?Sized>(&self, event: &E) -> bool {
        let mut budget = Budget::PER_EVENT;
        self.verdict(event, &mut budget) == Verdict::Match
    }
}
