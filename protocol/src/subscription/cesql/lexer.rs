//! Tokens of CESQL. Keywords and identifiers are case-insensitive; string literals keep case.

use super::ParseError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// An identifier, as written (keywords are recognized by the parser, case-insensitively).
    Ident(String),
    /// A decimal integer literal (may not fit 32 bits until a minus is folded in).
    Int(i64),
    Str(String),
    LParen,
    RParen,
    Comma,
    Eq,
    NotEq,
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
}

pub struct Token {
    pub tok: Tok,
    pub at: usize,
}

fn err(at: usize, message: impl Into<String>) -> ParseError {
    ParseError { at, message: message.into() }
}

/// Most tokens an expression may have. Every node of the tree consumes at least one token, so
/// this also bounds the tree's size, and with it the compile-time work and the memory a
/// subscription's filter holds. Real filters have tens of tokens.
pub const MAX_TOKENS: usize = 2048;

pub fn lex(text: &str) -> Result<Vec<Token>, ParseError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let at = i;
        let simple = |t: Tok, n: usize| (t, n);
        let (tok, len) = match c {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'(' => simple(Tok::LParen, 1),
            b')' => simple(Tok::RParen, 1),
            b',' => simple(Tok::Comma, 1),
            b'=' => simple(Tok::Eq, 1),
            b'+' => simple(Tok::Plus, 1),
            b'-' => simple(Tok::Minus, 1),
            b'*' => simple(Tok::Star, 1),
            b'/' => simple(Tok::Slash, 1),
            b'%' => simple(Tok::Percent, 1),
            b'!' if b.get(i + 1) == Some(&b'=') => simple(Tok::NotEq, 2),
            b'<' if b.get(i + 1) == Some(&b'>') => simple(Tok::NotEq, 2),
            b'<' if b.get(i + 1) == Some(&b'=') => simple(Tok::Le, 2),
            b'<' => simple(Tok::Lt, 1),
            b'>' if b.get(i + 1) == Some(&b'=') => simple(Tok::Ge, 2),
            b'>' => simple(Tok::Gt, 1),
            b'\'' | b'"' => {
                // A backslash escapes the closing quote; a doubled quote is one quote; every other
                // backslash stays, so LIKE patterns keep their `\%` and `\_` escapes.
                let q = c;
                let mut s = String::new();
                let mut j = i + 1;
                loop {
                    match b.get(j) {
                        None => return Err(err(at, "unterminated string literal")),
                        Some(&x) if x == q && b.get(j + 1) == Some(&q) => {
                            s.push(q as char);
                            j += 2;
                        }
                        Some(&x) if x == q => break,
                        Some(b'\\') if b.get(j + 1) == Some(&q) => {
                            s.push(q as char);
                            j += 2;
                        }
                        Some(_) => {
                            let ch = text[j..].chars().next().expect("in bounds");
                            s.push(ch);
                            j += ch.len_utf8();
                        }
                    }
                }
                (Tok::Str(s), j + 1 - i)
            }
            b'0'..=b'9' => {
                let end = b[i..].iter().position(|x| !x.is_ascii_digit()).map_or(b.len(), |n| i + n);
                if b.get(end).is_some_and(|x| x.is_ascii_alphabetic() || *x == b'_') {
                    return Err(err(end, "malformed number"));
                }
                let v: i64 = text[i..end].parse().map_err(|_| err(at, "integer literal out of range"))?;
                if v > i64::from(i32::MAX) + 1 {
                    return Err(err(at, "integer literal out of the 32-bit range"));
                }
                (Tok::Int(v), end - i)
            }
            x if x.is_ascii_alphabetic() || x == b'_' => {
                let end =
                    b[i..].iter().position(|x| !(x.is_ascii_alphanumeric() || *x == b'_')).map_or(b.len(), |n| i + n);
                (Tok::Ident(text[i..end].to_string()), end - i)
            }
            _ => return Err(err(at, format!("unexpected character {:?}", text[i..].chars().next().unwrap_or('?')))),
        };
        if out.len() == MAX_TOKENS {
            return Err(err(at, format!("expression longer than {MAX_TOKENS} tokens")));
        }
        out.push(Token { tok, at });
        i += len;
    }
    Ok(out)
}
