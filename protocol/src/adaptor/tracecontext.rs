//! W3C Trace Context (the CloudEvents distributed-tracing extension's attributes): the
//! `traceparent` (version 00) that names the span an event or a request comes from, parsed from
//! a header, a record header or an attribute and written back; and what a `tracestate` may be.

/// A parsed `traceparent`: the trace, the parent span and the flags (bit 0: sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace (never all zeros).
    pub trace_id: [u8; 16],
    /// The parent span (never all zeros).
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// The longest `tracestate` kept (W3C: vendors propagate at least 512 characters).
pub const MAX_TRACESTATE: usize = 512;

/// Whether `s` is a `tracestate` worth keeping: at most [`MAX_TRACESTATE`] bytes and 32 list
/// members, each `key=value` with W3C's characters (a key of `a-z 0-9 _ - * / @`, a value of
/// visible ASCII but `,` and `=`). Anything else is dropped, as the recommendation allows.
pub fn valid_tracestate(s: &str) -> bool {
    if s.len() > MAX_TRACESTATE {
        return false;
    }
    let members: Vec<&str> = s.split(',').map(|m| m.trim_matches([' ', '\t'])).filter(|m| !m.is_empty()).collect();
    !members.is_empty()
        && members.len() <= 32
        && members.iter().all(|m| {
            let Some((k, v)) = m.split_once('=') else { return false };
            let key = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b);
            let value = |b: u8| (b' '..=b'~').contains(&b) && b != b',' && b != b'=';
            !k.is_empty()
                && k.len() <= 256
                && k.bytes().all(key)
                && !v.is_empty()
                && v.len() <= 256
                && v.bytes().all(value)
        })
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
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 * bytes.len());
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
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
        s.push('-');
        hex_into(&[self.flags], &mut s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracestates_of_the_recommendations_shape_are_kept() {
        assert!(valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
        assert!(valid_tracestate("vendor@tenant=1 , x=y"));
        for bad in ["", "novalue", "=v", "k=", "K=v", "k=v\n", "k=a=b", &format!("k={}", "v".repeat(600))] {
            assert!(!valid_tracestate(bad), "{bad:?}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(!valid_tracestate(&many.join(",")));
    }

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
