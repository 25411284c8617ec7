//! The `Date` header (RFC 9110 section 6.6.1: an origin server with a clock sends it on every
//! final response), formatted once per second per thread.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
const MONTHS: [&[u8; 3]; 12] =
    [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];

/// `Sun, 06 Nov 1994 08:49:37 GMT` for `secs` since the Unix epoch.
pub fn format(secs: u64) -> [u8; 29] {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = crate::adaptor::civil_from_days(days as i64);
    let (year, month, day) = (year as u64, month as usize, day as u64);
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    out[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    let two = |v: u64| [b'0' + (v / 10 % 10) as u8, b'0' + (v % 10) as u8];
    out[5..7].copy_from_slice(&two(day));
    out[8..11].copy_from_slice(MONTHS[month - 1]);
    out[12..14].copy_from_slice(&two(year / 100));
    out[14..16].copy_from_slice(&two(year % 100));
    out[17..19].copy_from_slice(&two(rem / 3600));
    out[20..22].copy_from_slice(&two(rem / 60 % 60));
    out[23..25].copy_from_slice(&two(rem % 60));
    out
}

thread_local! {
    static CACHE: Cell<(u64, [u8; 29])> = const { Cell::new((u64::MAX, [0; 29])) };
}

/// The current `Date` value, reformatted at most once a second per thread.
pub fn now() -> [u8; 29] {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHE.with(|c| {
        let (at, text) = c.get();
        if at == secs {
            return text;
        }
        let text = format(secs);
        c.set((secs, text));
        text
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_imf_fixdate() {
        assert_eq!(&super::format(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&super::format(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&super::format(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&super::format(1_796_083_199), b"Mon, 30 Nov 2026 23:59:59 GMT");
    }
}
