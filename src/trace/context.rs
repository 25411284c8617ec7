//! W3C Trace Context's `traceparent` (version 00): what identifies the span an event or a
//! request comes from, parsed from a header or a CloudEvents attribute and written back.

use std::fmt::Write as _;

/// A parsed `traceparent`: the trace, the parent span and the flags (bit 0: sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`, appended to `out`.
pub fn hex_into(bytes: &[u8], out: &mut String) {
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C recommendation says: version `00` exactly 55
    /// characters; a later version at least that, its extra fields after a `-` ignored;
    /// version `ff`, uppercase hex, or an all-zero trace or span id are invalid.
    pub fn parse(s: &str) -> Option<TraceParent> {
        let s = s.trim_matches([' ', '\t']);
        if !s.is_ascii() {
            return None;
        }
        let version = hex::<1>(s.get(..2)?)?[0];
        if version == 0xff || (version == 0 && s.len() != 55) || s.len() < 55 {
            return None;
        }
        if s.len() > 55 && s.as_bytes()[55] != b'-' {
            return None;
        }
        let b = s.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = hex::<16>(&s[3..35])?;
        let span_id = hex::<8>(&s[36..52])?;
        let flags = hex::<1>(&s[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, span_id, flags })
    }

    /// Whether the caller sampled this trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The value for a header or an attribute (always version 00).
    pub fn format(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        hex_into(&self.trace_id, &mut s);
        s.push('-');
        hex_into(&self.span_id, &mut s);
        let _ = write!(s, "-{:02x}", self.flags);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_writes_back_what_the_recommendation_allows() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = TraceParent::parse(v).unwrap();
        assert!(tp.sampled());
        assert_eq!(tp.format(), v);
        assert!(!TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled());
        // A later version may carry more after a dash; it is read as 00 and written so.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert_eq!(TraceParent::parse(later).unwrap().format(), v);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }
}
