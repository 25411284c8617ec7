//! Webhook push (SPEC, "Other protocols"): what proves a push to a sink came from evmesh. Each
//! push carries `X-Em-Delivery-Id`, `X-Em-Timestamp` and `X-Em-Signature: sha256=<hex>`, the
//! HMAC-SHA256 keyed with the subscription's `sinkSecret` over
//! `method \n path \n timestamp \n hex(sha256(body))`, hex in lowercase. A sink recomputes it
//! over what it received and compares; the timestamp lets it refuse old replays.

use sha2::{Digest, Sha256};

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`, keyed with `key`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(Sha256::digest(key).as_slice());
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize().as_slice());
    let mut out = [0u8; 32];
    out.copy_from_slice(outer.finalize().as_slice());
    out
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|&b| [DIGITS[usize::from(b >> 4)] as char, DIGITS[usize::from(b & 15)] as char]).collect()
}

/// The `X-Em-Signature` value of a push: `sha256=` and the lowercase hex HMAC-SHA256, keyed
/// with `secret`, of `method\npath\ntimestamp\nhex(sha256(body))` (`path` as in the request
/// line, query included).
pub fn signature(secret: &[u8], method: &str, path: &str, timestamp: &str, body: &[u8]) -> String {
    let body_hash = hex(Sha256::digest(body).as_slice());
    let mac = hmac_sha256(
        secret,
        &[method.as_bytes(), b"\n", path.as_bytes(), b"\n", timestamp.as_bytes(), b"\n", body_hash.as_bytes()],
    );
    format!("sha256={}", hex(&mac))
}

/// The wait a `Retry-After` value asks for (RFC 9110, 10.2.3), in seconds: delay-seconds, or
/// an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) less `now` (Unix seconds; a date past is 0).
/// `None` for anything else.
pub fn retry_after(value: &str, now: u64) -> Option<u64> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(v.parse::<u64>().unwrap_or(u64::MAX));
    }
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let rest = v.get(5..)?;
    if v.as_bytes().get(3..5) != Some(b", ") {
        return None;
    }
    let mut parts = rest.split(' ');
    let (day, month, year, time, zone) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || zone != "GMT" || day.len() != 2 || year.len() != 4 || time.len() != 8 {
        return None;
    }
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let m = MONTHS.iter().position(|&x| x == month)? as i64 + 1;
    let num = |s: &str| s.bytes().all(|b| b.is_ascii_digit()).then(|| s.parse::<i64>().ok()).flatten();
    let (d, y) = (num(day)?, num(year)?);
    let mut hms = time.split(':');
    let (h, mi, sec) = (num(hms.next()?)?, num(hms.next()?)?, num(hms.next()?)?);
    if !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (H. Hinnant's algorithm), then seconds since the epoch.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let at = days * 86_400 + h * 3600 + mi * 60 + sec;
    Some((at - now as i64).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        assert_eq!(retry_after("120", 0), Some(120));
        assert_eq!(retry_after(" 0 ", 0), Some(0));
        assert_eq!(retry_after("99999999999999999999999", 0), Some(u64::MAX));
        // RFC 9110's example date is 784111777 seconds after the epoch.
        assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777 - 30), Some(30));
        assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777 + 5), Some(0), "past: at once");
        assert_eq!(retry_after("Thu, 01 Jan 1970 00:00:00 GMT", 0), Some(0));
        assert_eq!(retry_after("Wed, 02 Dec 2026 05:00:00 GMT", 1_796_187_600 - 1), Some(1));
        for bad in [
            "",
            "-1",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nox 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT x",
            "é, 06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(retry_after(bad, 0), None, "{bad:?}");
        }
    }

    /// RFC 4231's test cases 1, 2 and 6 (a key longer than the block).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], &[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"])),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(&[0xaa; 131], &[b"Test Using Larger Than Block-Size Key - Hash Key First"])),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_signature_covers_method_path_time_and_body() {
        let s = signature(b"s3cret", "POST", "/hook?a=1", "1796180000", b"{\"a\":1}");
        assert!(
            s.starts_with("sha256=")
                && s.len() == 7 + 64
                && s[7..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        // The same as computing it by hand from its definition.
        let body_hash = hex(Sha256::digest(b"{\"a\":1}").as_slice());
        let by_hand = hmac_sha256(b"s3cret", &[format!("POST\n/hook?a=1\n1796180000\n{body_hash}").as_bytes()]);
        assert_eq!(s, format!("sha256={}", hex(&by_hand)));
        for other in [
            signature(b"s3cret", "PUT", "/hook?a=1", "1796180000", b"{\"a\":1}"),
            signature(b"s3cret", "POST", "/hook", "1796180000", b"{\"a\":1}"),
            signature(b"s3cret", "POST", "/hook?a=1", "1796180001", b"{\"a\":1}"),
            signature(b"s3cret", "POST", "/hook?a=1", "1796180000", b"{\"a\":2}"),
            signature(b"other", "POST", "/hook?a=1", "1796180000", b"{\"a\":1}"),
        ] {
            assert_ne!(s, other);
        }
    }
}
