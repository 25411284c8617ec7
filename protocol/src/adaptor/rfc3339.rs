//! RFC 3339 timestamp checking (CloudEvents `time`) and formatting, without a date library.

/// Whether `s` is an RFC 3339 `date-time`.
pub fn is_valid(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r.clone()).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    let num = |r: std::ops::Range<usize>| -> u32 { b[r].iter().fold(0u32, |a, d| a * 10 + u32::from(d - b'0')) };
    if b.len() < 20 || !digits(0..4) || b[4] != b'-' || !digits(5..7) || b[7] != b'-' || !digits(8..10) {
        return false;
    }
    if !matches!(b[10], b'T' | b't' | b' ')
        || !digits(11..13)
        || b[13] != b':'
        || !digits(14..16)
        || b[16] != b':'
        || !digits(17..19)
    {
        return false;
    }
    let (year, month, day) = (num(0..4), num(5..7), num(8..10));
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if day == 0 || day > days || num(11..13) > 23 || num(14..16) > 59 || num(17..19) > 60 {
        return false;
    }
    let mut i = 19;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match &b[i..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit())
                && (h1 - b'0') * 10 + (h2 - b'0') <= 23
                && (m1 - b'0') * 10 + (m2 - b'0') <= 59
        }
        _ => false,
    }
}

/// Microseconds since the Unix epoch of a valid RFC 3339 timestamp (`None` if it is not one).
/// Leap seconds count as the next second; digits beyond microseconds are dropped.
pub fn to_micros(s: &str) -> Option<i64> {
    if !is_valid(s) {
        return None;
    }
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> i64 { b[r].iter().fold(0i64, |a, d| a * 10 + i64::from(d - b'0')) };
    let (y, m, d) = (num(0..4), num(5..7), num(8..10));
    // Days from 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let mut secs = days * 86_400 + num(11..13) * 3600 + num(14..16) * 60 + num(17..19);
    let mut micros = 0i64;
    let mut i = 19;
    if b[i] == b'.' {
        i += 1;
        let mut scale = 100_000;
        while b[i].is_ascii_digit() {
            micros += i64::from(b[i] - b'0') * scale;
            scale /= 10;
            i += 1;
        }
    }
    if matches!(b[i], b'+' | b'-') {
        let off = num(i + 1..i + 3) * 3600 + num(i + 4..i + 6) * 60;
        secs -= if b[i] == b'+' { off } else { -off };
    }
    Some(secs * 1_000_000 + micros)
}

/// The civil date `(year, month 1-12, day 1-31)` of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` for `micros` since the Unix epoch (years 0 to 9999).
pub fn from_micros(micros: i64) -> String {
    let (secs, frac) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{frac:06}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::{from_micros, is_valid, to_micros};

    #[test]
    fn formats_epoch_micros() {
        assert_eq!(from_micros(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(from_micros(1_796_040_000_500_000), "2026-11-30T12:00:00.500000Z");
        for s in ["2000-02-29T23:59:59.000001Z", "1969-12-31T23:59:59.999999Z", "2400-12-31T00:00:00.000000Z"] {
            assert_eq!(from_micros(to_micros(s).unwrap()), s);
        }
    }

    #[test]
    fn converts_to_epoch_micros() {
        assert_eq!(to_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(to_micros("2026-11-30T12:00:00.5Z"), Some(1_796_040_000_500_000));
        assert_eq!(to_micros("2026-11-30T13:00:00.5+01:00"), to_micros("2026-11-30T12:00:00.5Z"));
        assert_eq!(to_micros("2000-02-29T00:00:00.000001Z"), Some(951_782_400_000_001));
        assert_eq!(to_micros("yesterday"), None);
    }

    #[test]
    fn accepts_and_rejects() {
        for ok in ["2018-04-05T17:31:00Z", "2020-02-29T00:00:00.123456+01:00", "1985-04-12t23:20:50.52z"] {
            assert!(is_valid(ok), "{ok}");
        }
        for bad in [
            "2018-04-05",
            "2019-02-29T00:00:00Z",
            "2018-13-05T17:31:00Z",
            "2018-04-05T24:00:00Z",
            "2018-04-05T17:31:00",
            "2018-04-05T17:31:00.Z",
            "2018-04-05T17:31:00+0100",
            "x018-04-05T17:31:00Z",
        ] {
            assert!(!is_valid(bad), "{bad}");
        }
    }
}
