//! A flat JSON object's members as spans of its text: the fast path of a structured event's
//! parse, and of a batch's whose events are all flat (one scan, nothing built but the lists of
//! spans).
//!
//! serde_json scans a string value eight bytes at a time and was 8% of a publish's instructions
//! for an event with 900 bytes of string `data`. Here the end of a string is found with
//! `memchr2` (vector instructions, 32 bytes at a time where the CPU has them) and its bytes are
//! checked for control characters by their minimum, a reduction the compiler vectorizes.
//!
//! Only what is plainly valid is taken: an object whose member names and string values carry
//! no escapes, and whose values are strings, numbers, `true`, `false` or `null`. Anything else
//! (an escape, a nested object or array, a syntax error) gives `None`, and the caller parses
//! the text with serde_json, which takes the rest and says what is wrong. So an event this
//! pass takes is one serde_json takes with the same members (a property test holds it to that).

use std::borrow::Cow;

use smallvec::SmallVec;

/// Members a CloudEvent has without a heap allocation for the list.
pub(crate) const INLINE: usize = 16;

/// An object's members in order, duplicates kept: each name (a `Cow`, the type the slow path
/// needs for names with escapes) and its value's JSON text.
pub(crate) type Spans<'a> = SmallVec<[(Cow<'a, str>, &'a str); INLINE]>;

/// The members of `text`, pushed onto `out` (the caller's list, filled where it lies: a list
/// of 16 members is 650 bytes, and every move of it a copy); `false` unless `text` is one flat
/// object with no escapes (see the module's documentation), and then `out` holds nothing
/// meaningful.
pub(crate) fn members<'a>(text: &'a str, out: &mut Spans<'a>) -> bool {
    object(text, ws(text.as_bytes(), 0), out).is_some_and(|end| ws(text.as_bytes(), end) == text.len())
}

/// `each` of the members of each object of `text`, a JSON array of flat objects (a batch of
/// events), as the scan reaches it; `None` unless every element is one (then serde_json reads
/// the batch, and what `each` made is dropped).
pub(crate) fn array<'a, T>(text: &'a str, mut each: impl FnMut(Spans<'a>) -> T) -> Option<Vec<T>> {
    let b = text.as_bytes();
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    i = ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return (ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        let mut spans = Spans::new();
        let end = object(text, i, &mut spans)?;
        out.push(each(spans));
        i = ws(b, end);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b']' => return (ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

/// The flat object at `i` of `text`: its members pushed onto `out`, and where it ends (past
/// its `}`).
fn object<'a>(text: &'a str, mut i: usize, out: &mut Spans<'a>) -> Option<usize> {
    let b = text.as_bytes();
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let close = string_end(b, i)?;
        let name = &text[i + 1..close];
        i = ws(b, close + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(b, i + 1);
        let start = i;
        i = match b.get(i)? {
            b'"' => string_end(b, i)? + 1,
            b't' => literal(b, i, b"true")?,
            b'f' => literal(b, i, b"false")?,
            b'n' => literal(b, i, b"null")?,
            b'-' | b'0'..=b'9' => number(b, i)?,
            _ => return None,
        };
        out.push((Cow::Borrowed(name), &text[start..i]));
        i = ws(b, i);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Past JSON's whitespace from `i`.
fn ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index of the quote closing the string opened at `open`; `None` if it holds an escape
/// or a control character, or never closes.
fn string_end(b: &[u8], open: usize) -> Option<usize> {
    let rest = &b[open + 1..];
    let n = memchr::memchr2(b'"', b'\\', rest)?;
    if rest[n] != b'"' {
        return None;
    }
    // The least byte, with no early exit: a vectorized reduction.
    if rest[..n].iter().copied().min().is_some_and(|least| least < 0x20) {
        return None;
    }
    Some(open + 1 + n)
}

/// Past `lit` at `i`, if it is there.
fn literal(b: &[u8], i: usize, lit: &[u8]) -> Option<usize> {
    b[i..].starts_with(lit).then_some(i + lit.len())
}

/// Past the JSON number at `i` (`-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`).
fn number(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |i: usize| i + b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    if b[i] == b'-' {
        i += 1;
    }
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(i),
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return None;
        }
        i = end;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::{array, members, string_end};
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    type Pairs = Vec<(String, String)>;

    /// An object as serde_json reads it: (name, raw value) pairs, in order, duplicates kept.
    struct Obj(Pairs);

    impl<'de> serde::Deserialize<'de> for Obj {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Pairs;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Pairs, A::Error> {
                    let mut v = Vec::new();
                    while let Some(k) = m.next_key::<String>()? {
                        let raw: &RawValue = m.next_value()?;
                        v.push((k, raw.get().to_owned()));
                    }
                    Ok(v)
                }
            }
            d.deserialize_map(V).map(Obj)
        }
    }

    /// serde_json's reading of an object (the slow path's view).
    fn raw_members(text: &str) -> Option<Pairs> {
        serde_json::from_str::<Obj>(text).ok().map(|o| o.0)
    }

    /// serde_json's reading of an array of objects.
    fn raw_array(text: &str) -> Option<Vec<Pairs>> {
        serde_json::from_str::<Vec<Obj>>(text).ok().map(|v| v.into_iter().map(|o| o.0).collect())
    }

    fn pairs(spans: &super::Spans<'_>) -> Pairs {
        spans.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn fast(text: &str) -> Option<Pairs> {
        let mut spans = super::Spans::new();
        members(text, &mut spans).then(|| pairs(&spans))
    }

    fn fast_array(text: &str) -> Option<Vec<Pairs>> {
        array(text, |spans| pairs(&spans))
    }

    #[test]
    fn batches_of_flat_events_are_taken_and_the_rest_left_to_serde() {
        let batch = r#" [ {"id":"a","n":1} , {} ,{"data":"x"}] "#;
        assert_eq!(fast_array(batch), raw_array(batch));
        assert_eq!(fast_array(batch).unwrap().len(), 3);
        assert_eq!(fast_array("[]"), Some(vec![]));
        for other in
            [r#"[{"a":1},]"#, r#"[{"a":1}"#, r#"[{"a":1}] x"#, r#"[{"a":{"b":1}}]"#, r#"[1]"#, r#"{"a":1}"#, ""]
        {
            assert_eq!(fast_array(other), None, "{other:?}");
        }
    }

    #[test]
    fn flat_events_are_taken_and_the_rest_left_to_serde() {
        let event = r#" { "specversion" : "1.0", "id":"a", "n": -12.5e+3, "ok": true, "no": false, "x": null, "data": "héllo" } "#;
        assert_eq!(fast(event), raw_members(event));
        assert_eq!(fast(event).unwrap().len(), 7);
        assert_eq!(fast("{}"), Some(vec![]));
        assert_eq!(fast(r#"{"a":1,"a":2}"#).unwrap().len(), 2, "duplicates are the caller's to refuse");
        for other in [
            r#"{"a":"\n"}"#,       // an escape
            r#"{"a\u0041":1}"#,    // an escape in a name
            r#"{"data":{"b":1}}"#, // nested
            r#"{"data":[1]}"#,     // nested
            "{\"a\":\"\u{1}\"}",   // a raw control character
            r#"{"a":1}x"#,         // trailing text
            r#"{"a":1,}"#,         // a trailing comma
            r#"{"a":01}"#,         // a leading zero
            r#"{"a":1.}"#,         // no fraction digits
            r#"{"a":1e}"#,         // no exponent digits
            r#"{"a":-}"#,          // a sign alone
            r#"{"a":tru}"#,        // a cut literal
            r#"{"a":truex}"#,      // a literal run on
            r#"{"a" 1}"#,          // no colon
            r#"{"a":1"#,           // unclosed
            r#"{"a":"b}"#,         // an unclosed string
            "[]",
            "",
        ] {
            assert_eq!(fast(other), None, "{other:?}");
        }
    }

    /// The vector scans stop where a byte-by-byte one does: at the first quote, escape or
    /// control character, wherever it falls against their 32-byte blocks, taking only a quote.
    #[test]
    fn a_string_ends_at_its_first_quote_unless_an_escape_or_control_comes_first() {
        let bytewise = |b: &[u8], open: usize| {
            let at = open + 1 + b[open + 1..].iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
            (b[at] == b'"').then_some(at)
        };
        for len in 0..100 {
            for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                for p in 0..len {
                    let mut text = vec![b'"'];
                    text.extend((0..len).map(|k| if k == p { stop } else { b"a\xc3\xa9 ~"[k % 5] }));
                    text.push(b'"');
                    let got = string_end(&text, 0);
                    assert_eq!(got, bytewise(&text, 0), "len {len}, {stop:#x} at {p}");
                    assert_eq!(got, (stop == b'"').then_some(1 + p), "len {len}, {stop:#x} at {p}");
                }
                let mut open = vec![b'"'];
                open.extend(std::iter::repeat_n(b'x', len));
                assert_eq!(string_end(&open, 0), None, "never closed, len {len}");
            }
        }
    }

    /// Bytes JSON objects are made of, in runs that often form valid members.
    fn pieces() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{".to_owned()),
            Just("}".to_owned()),
            Just(",".to_owned()),
            Just(":".to_owned()),
            Just(" ".to_owned()),
            Just("\"".to_owned()),
            Just("\\".to_owned()),
            Just("\u{1}".to_owned()),
            Just("[1]".to_owned()),
            Just("true".to_owned()),
            Just("nul".to_owned()),
            "\"[a-zé ]{0,6}\"",
            "-?[0-9]{0,3}(\\.[0-9]{0,2})?([eE][+-]?[0-9]{0,2})?",
        ];
        prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    fn member() -> impl Strategy<Value = String> {
        let value = prop_oneof![
            "\"[a-z0-9é ]{0,8}\"",
            "\"[a-z]{0,3}(\\\\n|\\\\\"|\\\\u0041)[a-z]{0,3}\"",
            "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,2})?([eE][+-]?[0-9]{1,2})?",
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
            Just("{\"n\":1}".to_owned()),
        ];
        ("[a-z]{1,5}", value, "[ \t\n]{0,2}").prop_map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}{w}"))
    }

    proptest! {
        /// Whatever the fast pass takes, serde_json takes with the same members.
        #[test]
        fn what_the_fast_pass_takes_serde_takes_alike(text in pieces()) {
            if let Some(m) = fast(&text) {
                prop_assert_eq!(Some(m), raw_members(&text), "{:?}", text);
            }
        }

        /// Whatever the fast pass takes as a batch, serde_json takes with the same members.
        #[test]
        fn what_the_fast_pass_takes_as_a_batch_serde_takes_alike(parts in prop::collection::vec(pieces(), 0..4)) {
            let text = format!("[{}]", parts.join(","));
            if let Some(v) = fast_array(&text) {
                prop_assert_eq!(Some(v), raw_array(&text), "{:?}", text);
            }
        }

        /// Batches of well-formed objects: taken by both alike, unless one holds what the pass
        /// leaves to serde.
        #[test]
        fn batches_are_taken_alike(objects in prop::collection::vec(prop::collection::vec(member(), 0..6), 0..6)) {
            let text = format!("[{}]", objects.iter().map(|m| format!("{{{}}}", m.join(","))).collect::<Vec<_>>().join(" , "));
            let slow = raw_array(&text);
            prop_assert!(slow.is_some(), "{:?}", text);
            match fast_array(&text) {
                Some(v) => prop_assert_eq!(Some(v), slow),
                None => prop_assert!(text.contains('\\') || text.contains("{\"n\""), "{:?}", text),
            }
        }

        /// Well-formed objects: taken by both alike, unless they hold what the pass leaves to
        /// serde (escapes, nested values).
        #[test]
        fn objects_are_taken_alike(members in prop::collection::vec(member(), 0..12)) {
            let text = format!("{{{}}}", members.join(","));
            let slow = raw_members(&text);
            prop_assert!(slow.is_some(), "{:?}", text);
            match fast(&text) {
                Some(m) => prop_assert_eq!(Some(m), slow),
                None => prop_assert!(text.contains('\\') || text.contains("{\"n\""), "{:?}", text),
            }
        }
    }
}
