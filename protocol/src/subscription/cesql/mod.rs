//! CloudEvents SQL (CESQL 1.0): a parser and an evaluator, our own code, checked against the
//! CESQL TCK (`../shared/conformance/cesql_tck`, every case: value and error kind).
//!
//! Pure: an expression is compiled once per subscription ([`compile`]) into an [`Expr`] tree and
//! then evaluated per event against anything that can look up attributes ([`Event`]).
//! Evaluation never fails: like the spec, an error (missing attribute, bad cast, division by
//! zero...) yields the zero value of the operation's type and is reported beside the result.
//!
//! Filters come from clients, so every cost is bounded. Compiling: at most [`MAX_TOKENS`]
//! tokens, [`MAX_ARGS`] arguments per call, a tree at most [`MAX_DEPTH`] high (operator
//! chains included), so parsing, evaluating and dropping never recurse deeper. Evaluating: a
//! [`Budget`] of steps and bytes produced per event ([`MAX_STEPS`], [`MAX_BYTES`]), LIKE as
//! substring searches rather than backtracking; past the budget an event does not match and
//! the caller is told ([`Verdict::OverBudget`]).

mod eval;
mod lexer;
mod parser;

pub use eval::{Budget, Event, Outcome, Verdict, MAX_BYTES, MAX_STEPS};
pub use lexer::MAX_TOKENS;
pub use parser::{Expr, MAX_ARGS, MAX_DEPTH};

/// A CESQL value: the language has three types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A Boolean.
    Bool(bool),
    /// An Integer: signed 32-bit, overflow is a math error.
    Int(i32),
    /// A String.
    Str(String),
}

/// The error kinds of the CESQL TCK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The expression is not valid CESQL (only when compiling).
    Parse,
    /// Division or modulo by zero, or an integer result outside 32 bits.
    Math,
    /// A value that does not convert to the type an operation needs (`'abc' + 1`).
    Cast,
    /// A call to a function that does not exist, or not with that many arguments.
    MissingFunction,
    /// A function given arguments it cannot work with (an index out of range, say).
    FunctionEvaluation,
    /// An attribute the event does not carry.
    MissingAttribute,
    /// The TCK's catch-all for any other error; this evaluator raises none.
    Generic,
}

impl ErrorKind {
    /// The TCK's name for the kind.
    pub fn tck_name(self) -> &'static str {
        match self {
            ErrorKind::Parse => "parse",
            ErrorKind::Math => "math",
            ErrorKind::Cast => "cast",
            ErrorKind::MissingFunction => "missingFunction",
            ErrorKind::FunctionEvaluation => "functionEvaluation",
            ErrorKind::MissingAttribute => "missingAttribute",
            ErrorKind::Generic => "generic",
        }
    }
}

/// Why an expression does not parse, with the byte offset where it went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CESQL parse error at {at}: {message}")]
pub struct ParseError {
    /// Byte offset into the expression text where it went wrong (the text's length if it ended
    /// too soon).
    pub at: usize,
    /// What is wrong there.
    pub message: String,
}

/// Parses `text` into an expression tree, once.
pub fn compile(text: &str) -> Result<Expr, ParseError> {
    let tokens = lexer::lex(text)?;
    parser::parse(&tokens, text.len())
}

#[cfg(test)]
mod tck;
#[cfg(test)]
mod tests;
