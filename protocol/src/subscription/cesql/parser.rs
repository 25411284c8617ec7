//! CESQL grammar, following the spec's ANTLR grammar and its precedence: function calls, then
//! the prefix operators (NOT, unary minus, EXISTS) over a single primary, then the postfix LIKE
//! and IN, then `* / %`, then `+ -`, then comparisons (left-associative), then AND / OR / XOR at
//! one level, right-associative.

use super::lexer::{Tok, Token};
use super::{ParseError, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    And,
    Or,
    Xor,
    Eq,
    NotEq,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    Length,
    Concat,
    ConcatWs,
    Lower,
    Upper,
    Trim,
    Left,
    Right,
    Substring,
    Abs,
    Int,
    Bool,
    String,
    IsBool,
    IsInt,
}

impl Function {
    fn resolve(name: &str, arity: usize) -> Option<Function> {
        use Function::*;
        let (f, ok) = match name.to_ascii_uppercase().as_str() {
            "LENGTH" => (Length, arity == 1),
            "CONCAT" => (Concat, true),
            "CONCAT_WS" => (ConcatWs, arity >= 1),
            "LOWER" => (Lower, arity == 1),
            "UPPER" => (Upper, arity == 1),
            "TRIM" => (Trim, arity == 1),
            "LEFT" => (Left, arity == 2),
            "RIGHT" => (Right, arity == 2),
            "SUBSTRING" => (Substring, arity == 2 || arity == 3),
            "ABS" => (Abs, arity == 1),
            "INT" => (Int, arity == 1),
            "BOOL" => (Bool, arity == 1),
            "STRING" => (String, arity == 1),
            "IS_BOOL" => (IsBool, arity == 1),
            "IS_INT" => (IsInt, arity == 1),
            _ => return None,
        };
        ok.then_some(f)
    }
}

/// One piece of a LIKE pattern between two `%`: a fixed number of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Each character, `None` for `_` (exactly one character).
    pub chars: Vec<Option<char>>,
    /// The same piece as text when it has no `_`: found with a linear-time substring search.
    pub literal: Option<String>,
}

/// A compiled LIKE pattern: the pieces between `%`s, so matching is a few substring searches
/// (greedy leftmost placement is exact when every piece has a fixed length), never a
/// backtracking walk over the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The first piece is anchored at the start and, if `percent`, the last at the end; those
    /// two may be empty, the ones between never are.
    pub pieces: Vec<Piece>,
    /// Whether the pattern has any `%`; without one, the single piece must match the whole value.
    pub percent: bool,
}

/// A compiled CESQL expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// A literal: `TRUE`, `42`, `'text'`.
    Lit(Value),
    /// A context attribute or extension, by its lower-cased name.
    Attr(String),
    /// `EXISTS name`: whether the event carries the attribute (lower-cased name).
    Exists(String),
    /// `NOT x`: logical negation.
    Not(Box<Expr>),
    /// `-x`: integer negation.
    Neg(Box<Expr>),
    /// A binary operator (arithmetic, comparison, `AND`, `OR`, `XOR`) and its operands.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `expr [NOT] LIKE 'pattern'`, the pattern compiled (`%` any run, `_` one character).
    Like {
        /// The value matched, as a string.
        expr: Box<Expr>,
        /// The compiled pattern.
        pattern: Pattern,
        /// Whether it is `NOT LIKE`.
        negated: bool,
    },
    /// `expr [NOT] IN (a, b, ...)`.
    In {
        /// The value looked for.
        expr: Box<Expr>,
        /// The values it is compared with, in order.
        set: Vec<Expr>,
        /// Whether it is `NOT IN`.
        negated: bool,
    },
    /// A call to a built-in function with its arguments (arity checked when compiling).
    Call(Function, Vec<Expr>),
    /// A call to a function that does not exist (or not with this many arguments): evaluates to
    /// false with a `missingFunction` error, as the TCK expects.
    MissingFunction(String),
}

fn compile_like(p: &str) -> Pattern {
    let mut pieces: Vec<Vec<Option<char>>> = vec![Vec::new()];
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        let c = match c {
            '\\' => match chars.peek() {
                Some('%') | Some('_') => chars.next(),
                _ => Some('\\'),
            },
            '%' => {
                pieces.push(Vec::new());
                continue;
            }
            '_' => None,
            c => Some(c),
        };
        pieces.last_mut().expect("never empty").push(c);
    }
    let percent = pieces.len() > 1;
    let last = pieces.len() - 1;
    let pieces = pieces
        .into_iter()
        .enumerate()
        .filter(|(i, p)| *i == 0 || *i == last || !p.is_empty())
        .map(|(_, chars)| {
            let literal = chars.iter().copied().collect::<Option<String>>();
            Piece { chars, literal }
        })
        .collect();
    Pattern { pieces, percent }
}

/// Deepest nesting accepted: filters come from clients, and parsing, evaluation and dropping
/// recurse. It bounds both the parser's recursion and the height of the tree it builds, where
/// each operator of a chain such as `a + b + c` is one level.
pub const MAX_DEPTH: usize = 64;

/// Most arguments of one function call (CESQL's functions take at most three, except
/// `CONCAT` and `CONCAT_WS`).
pub const MAX_ARGS: usize = 64;

struct Parser<'t> {
    toks: &'t [Token],
    pos: usize,
    end: usize,
    depth: usize,
}

fn is_kw(t: Option<&Tok>, kw: &str) -> bool {
    matches!(t, Some(Tok::Ident(s)) if s.eq_ignore_ascii_case(kw))
}

const KEYWORDS: [&str; 9] = ["AND", "OR", "XOR", "NOT", "LIKE", "IN", "EXISTS", "TRUE", "FALSE"];

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn peek2(&self) -> Option<&Tok> {
        self.toks.get(self.pos + 1).map(|t| &t.tok)
    }

    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.at)
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError { at: self.at(), message: message.into() })
    }

    fn expect(&mut self, t: Tok, what: &str) -> Result<(), ParseError> {
        if self.peek() == Some(&t) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(format!("expected {what}"))
        }
    }

    fn nest(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err(format!("expression nested deeper than {MAX_DEPTH}"));
        }
        Ok(())
    }

    fn logic(&mut self) -> Result<Expr, ParseError> {
        self.nest()?;
        let e = self.logic_inner();
        self.depth -= 1;
        e
    }

    fn logic_inner(&mut self) -> Result<Expr, ParseError> {
        let lhs = self.comparison()?;
        let op = match self.peek() {
            t if is_kw(t, "AND") => BinOp::And,
            t if is_kw(t, "OR") => BinOp::Or,
            t if is_kw(t, "XOR") => BinOp::Xor,
            _ => return Ok(lhs),
        };
        self.pos += 1;
        let rhs = self.logic()?;
        Ok(Expr::Binary(op, Box::new(lhs), Box::new(rhs)))
    }

    /// One left-associative level: `next (op next)*`, where `op_of` names this level's operators.
    fn left_assoc(
        &mut self,
        next: fn(&mut Self) -> Result<Expr, ParseError>,
        op_of: fn(&Tok) -> Option<BinOp>,
    ) -> Result<Expr, ParseError> {
        let mut lhs = next(self)?;
        while let Some(op) = self.peek().and_then(op_of) {
            self.pos += 1;
            let rhs = next(self)?;
            lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn comparison(&mut self) -> Result<Expr, ParseError> {
        self.left_assoc(Self::additive, |t| match t {
            Tok::Eq => Some(BinOp::Eq),
            Tok::NotEq => Some(BinOp::NotEq),
            Tok::Lt => Some(BinOp::Lt),
            Tok::Le => Some(BinOp::Le),
            Tok::Gt => Some(BinOp::Gt),
            Tok::Ge => Some(BinOp::Ge),
            _ => None,
        })
    }

    fn additive(&mut self) -> Result<Expr, ParseError> {
        self.left_assoc(Self::multiplicative, |t| match t {
            Tok::Plus => Some(BinOp::Add),
            Tok::Minus => Some(BinOp::Sub),
            _ => None,
        })
    }

    fn multiplicative(&mut self) -> Result<Expr, ParseError> {
        self.left_assoc(Self::postfix, |t| match t {
            Tok::Star => Some(BinOp::Mul),
            Tok::Slash => Some(BinOp::Div),
            Tok::Percent => Some(BinOp::Mod),
            _ => None,
        })
    }

    /// `x [NOT] LIKE 'p'` and `x [NOT] IN (a, b)`.
    fn postfix(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.unary()?;
        loop {
            let negated = is_kw(self.peek(), "NOT") && (is_kw(self.peek2(), "LIKE") || is_kw(self.peek2(), "IN"));
            if negated {
                self.pos += 1;
            }
            if is_kw(self.peek(), "LIKE") {
                self.pos += 1;
                let Some(Tok::Str(p)) = self.peek().cloned() else {
                    return self.err("LIKE needs a string literal pattern");
                };
                self.pos += 1;
                e = Expr::Like { expr: Box::new(e), pattern: compile_like(&p), negated };
            } else if is_kw(self.peek(), "IN") {
                self.pos += 1;
                self.expect(Tok::LParen, "( after IN")?;
                let mut set = vec![self.logic()?];
                while self.peek() == Some(&Tok::Comma) {
                    self.pos += 1;
                    set.push(self.logic()?);
                }
                self.expect(Tok::RParen, ") closing the IN set")?;
                e = Expr::In { expr: Box::new(e), set, negated };
            } else {
                return Ok(e);
            }
        }
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        self.nest()?;
        let e = self.unary_inner();
        self.depth -= 1;
        e
    }

    fn unary_inner(&mut self) -> Result<Expr, ParseError> {
        match self.peek().cloned() {
            Some(t) if is_kw(Some(&t), "NOT") => {
                self.pos += 1;
                Ok(Expr::Not(Box::new(self.unary()?)))
            }
            Some(Tok::Minus) => {
                self.pos += 1;
                // A minus directly before a number is part of the literal, so -2147483648 exists.
                if let Some(Tok::Int(v)) = self.peek().cloned() {
                    self.pos += 1;
                    return Ok(Expr::Lit(Value::Int(i32::try_from(-v).expect("the lexer bounds literals to 2^31"))));
                }
                Ok(Expr::Neg(Box::new(self.unary()?)))
            }
            Some(t) if is_kw(Some(&t), "EXISTS") => {
                self.pos += 1;
                match self.peek().cloned() {
                    Some(Tok::Ident(name)) if !KEYWORDS.iter().any(|k| name.eq_ignore_ascii_case(k)) => {
                        self.pos += 1;
                        Ok(Expr::Exists(name.to_ascii_lowercase()))
                    }
                    _ => self.err("EXISTS needs an attribute name"),
                }
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let Some(tok) = self.peek().cloned() else { return self.err("unexpected end of expression") };
        self.pos += 1;
        match tok {
            Tok::LParen => {
                let e = self.logic()?;
                self.expect(Tok::RParen, ")")?;
                Ok(e)
            }
            Tok::Int(v) => match i32::try_from(v) {
                Ok(v) => Ok(Expr::Lit(Value::Int(v))),
                Err(_) => {
                    self.pos -= 1;
                    self.err("integer literal out of the 32-bit range")
                }
            },
            Tok::Str(s) => Ok(Expr::Lit(Value::Str(s))),
            Tok::Ident(name) => {
                if name.eq_ignore_ascii_case("TRUE") {
                    return Ok(Expr::Lit(Value::Bool(true)));
                }
                if name.eq_ignore_ascii_case("FALSE") {
                    return Ok(Expr::Lit(Value::Bool(false)));
                }
                if KEYWORDS.iter().any(|k| name.eq_ignore_ascii_case(k)) {
                    self.pos -= 1;
                    return self.err(format!("unexpected keyword {name}"));
                }
                if self.peek() == Some(&Tok::LParen) {
                    self.pos += 1;
                    let mut args = Vec::new();
                    if self.peek() != Some(&Tok::RParen) {
                        args.push(self.logic()?);
                        while self.peek() == Some(&Tok::Comma) {
                            if args.len() == MAX_ARGS {
                                return self.err(format!("a function takes at most {MAX_ARGS} arguments"));
                            }
                            self.pos += 1;
                            args.push(self.logic()?);
                        }
                    }
                    self.expect(Tok::RParen, ") closing the argument list")?;
                    return Ok(match Function::resolve(&name, args.len()) {
                        Some(f) => Expr::Call(f, args),
                        None => Expr::MissingFunction(format!("{}/{}", name.to_ascii_uppercase(), args.len())),
                    });
                }
                if !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    self.pos -= 1;
                    return self.err(format!("{name} is not an attribute name ([a-z0-9]+)"));
                }
                Ok(Expr::Attr(name.to_ascii_lowercase()))
            }
            _ => {
                self.pos -= 1;
                self.err("unexpected token")
            }
        }
    }
}

/// The height of a tree, walked without recursion (it may not be checked yet).
fn height(e: &Expr) -> usize {
    let mut max = 0;
    let mut stack = vec![(e, 1)];
    while let Some((e, h)) = stack.pop() {
        max = max.max(h);
        match e {
            Expr::Lit(_) | Expr::Attr(_) | Expr::Exists(_) | Expr::MissingFunction(_) => {}
            Expr::Not(x) | Expr::Neg(x) | Expr::Like { expr: x, .. } => stack.push((&**x, h + 1)),
            Expr::Binary(_, l, r) => {
                stack.push((&**l, h + 1));
                stack.push((&**r, h + 1));
            }
            Expr::In { expr, set, .. } => {
                stack.push((&**expr, h + 1));
                stack.extend(set.iter().map(|c| (c, h + 1)));
            }
            Expr::Call(_, args) => stack.extend(args.iter().map(|c| (c, h + 1))),
        }
    }
    max
}

pub fn parse(toks: &[Token], end: usize) -> Result<Expr, ParseError> {
    let mut p = Parser { toks, pos: 0, end, depth: 0 };
    let e = p.logic()?;
    if p.pos != toks.len() {
        return p.err("unexpected trailing input");
    }
    // Left-associative chains are built by a loop, not by recursion, so their height is
    // checked here: evaluation recurses once per level.
    if height(&e) > MAX_DEPTH {
        return Err(ParseError {
            at: 0,
            message: format!(
                "expression nested deeper than {MAX_DEPTH} (each operator of a chain such as a + b + c is one level)"
            ),
        });
    }
    Ok(e)
}
