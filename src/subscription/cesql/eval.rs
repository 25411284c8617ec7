//! Evaluating a compiled expression against one event.
//!
//! Errors never stop evaluation: the failing operation yields its type's zero value and the
//! first error is reported in the [`Outcome`]. A missing attribute makes the operation that uses
//! it yield its zero value without computing (so `missing / 0` is a missing-attribute error, not
//! a division by zero), as the TCK requires.

use super::parser::{BinOp, Expr, Function, PatTok};
use super::{ErrorKind, Value};

/// What an expression can read: the event's context attributes and extensions by name.
pub trait Event {
    fn attribute(&self, name: &str) -> Option<Value>;
}

/// The result of one evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub value: Value,
    /// The first error met, if any.
    pub error: Option<ErrorKind>,
}

/// The result of evaluating one node.
enum Res {
    Ok(Value),
    /// Computed, but an error was raised on the way.
    Err(Value),
    /// A missing attribute: no value at all.
    Missing,
}

struct Ctx<'e, E: Event + ?Sized> {
    event: &'e E,
    error: Option<ErrorKind>,
    /// How many errors were raised so far (only the first is reported).
    raised: usize,
}

impl<E: Event + ?Sized> Ctx<'_, E> {
    fn fail(&mut self, kind: ErrorKind) {
        self.error.get_or_insert(kind);
        self.raised += 1;
    }

    fn int(&mut self, v: Value) -> i32 {
        match v {
            Value::Int(i) => i,
            Value::Bool(b) => i32::from(b),
            Value::Str(s) => s.parse().unwrap_or_else(|_| {
                self.fail(ErrorKind::Cast);
                0
            }),
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
            Value::Str(_) => Value::Str(string(v)),
        }
    }

    /// Evaluates `e`. An operand that errored (or is missing) makes its operator yield that
    /// operator's zero value, marked as errored too; the operator that raised an error keeps the
    /// value it computed with zero-valued inputs (so `NOT 10` is true with a cast error).
    fn eval(&mut self, e: &Expr) -> Res {
        match e {
            Expr::Lit(v) => Res::Ok(v.clone()),
            Expr::Attr(name) => match self.event.attribute(name) {
                Some(v) => Res::Ok(v),
                None => {
                    self.fail(ErrorKind::MissingAttribute);
                    Res::Missing
                }
            },
            Expr::Exists(name) => Res::Ok(Value::Bool(self.event.attribute(name).is_some())),
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
                Res::Ok(Value::Bool(like(&string(v), pattern) != *negated))
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
            Function::String => Value::Str(string(next!())),
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
            Function::Length => Value::Int(string(next!()).chars().count().min(i32::MAX as usize) as i32),
            Function::Lower => Value::Str(string(next!()).to_lowercase()),
            Function::Upper => Value::Str(string(next!()).to_uppercase()),
            Function::Trim => Value::Str(string(next!()).trim().to_owned()),
            Function::Concat => Value::Str(args.by_ref().map(string).collect()),
            Function::ConcatWs => {
                let sep = string(next!());
                let parts: Vec<String> = args.by_ref().map(string).collect();
                Value::Str(parts.join(&sep))
            }
            Function::Left | Function::Right => {
                let s = string(next!());
                let n = self.int(next!());
                if n < 0 {
                    self.fail(ErrorKind::FunctionEvaluation);
                    return Value::Str(s);
                }
                let chars: Vec<char> = s.chars().collect();
                let n = (n as usize).min(chars.len());
                Value::Str(if f == Function::Left {
                    chars[..n].iter().collect()
                } else {
                    chars[chars.len() - n..].iter().collect()
                })
            }
            Function::Substring => {
                let s = string(next!());
                let pos = self.int(next!());
                let len = args.next().map(|v| self.int(v));
                let chars: Vec<char> = s.chars().collect();
                let n = chars.len() as i64;
                let pos = i64::from(pos);
                if pos == 0 {
                    return Value::Str(String::new());
                }
                if pos.abs() > n || len.is_some_and(|l| l < 0) {
                    self.fail(ErrorKind::FunctionEvaluation);
                    return Value::Str(String::new());
                }
                let start = if pos > 0 { pos - 1 } else { n + pos } as usize;
                let end = len.map_or(chars.len(), |l| (start + l as usize).min(chars.len()));
                Value::Str(chars[start..end].iter().collect())
            }
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

/// LIKE matching: `%` any run, `_` one character; backtracks only to the last `%`.
fn like(s: &str, p: &[PatTok]) -> bool {
    let s: Vec<char> = s.chars().collect();
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match p.get(j) {
            Some(PatTok::Many) => {
                star = Some((j, i));
                j += 1;
            }
            Some(PatTok::One) => {
                i += 1;
                j += 1;
            }
            Some(PatTok::Lit(c)) if *c == s[i] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((sj, si)) => {
                    star = Some((sj, si + 1));
                    j = sj + 1;
                    i = si + 1;
                }
                None => return false,
            },
        }
    }
    p[j..].iter().all(|t| *t == PatTok::Many)
}

impl Expr {
    /// Evaluates against `event`; never fails (see the module docs).
    pub fn evaluate<E: Event + ?Sized>(&self, event: &E) -> Outcome {
        let mut ctx = Ctx { event, error: None, raised: 0 };
        let value = match ctx.eval(self) {
            Res::Ok(v) | Res::Err(v) => v,
            Res::Missing => Value::Bool(false),
        };
        Outcome { value, error: ctx.error }
    }

    /// Whether `event` passes this filter: the expression is exactly boolean true.
    pub fn matches<E: Event + ?Sized>(&self, event: &E) -> bool {
        self.evaluate(event).value == Value::Bool(true)
    }
}
