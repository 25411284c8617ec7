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
    /// Whether this thread's loop says the time with [`tick`] (then [`now`] reads no clock).
    static TICKED: Cell<bool> = const { Cell::new(false) };
}

/// Says the time (`secs` since the Unix epoch) for this thread's `Date` values: a thread whose
/// loop calls this at least once a second (the broker's deadline sweep, every 10 ms) saves a
/// clock reading per response. Before the first call, [`now`] reads the system clock. After
/// it, a `Date` is as old as the tick: a loop that stalls (one poll holding the thread for
/// seconds) answers with the second its stall began.
pub fn tick(secs: u64) {
    TICKED.set(true);
    set(secs);
}

/// The current `Date` value, reformatted at most once a second per thread.
pub fn now() -> [u8; 29] {
    if TICKED.get() {
        return CACHE.get().1;
    }
    set(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

fn set(secs: u64) -> [u8; 29] {
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
    /// A ticked thread's `Date` is the tick's second, with no clock read.
    #[test]
    fn a_ticked_thread_answers_with_the_ticked_second() {
        std::thread::spawn(|| {
            let untouched = super::now();
            assert_eq!(&untouched[26..], b"GMT");
            super::tick(784_111_777);
            assert_eq!(&super::now(), b"Sun, 06 Nov 1994 08:49:37 GMT");
            super::tick(784_111_778);
            assert_eq!(&super::now(), b"Sun, 06 Nov 1994 08:49:38 GMT");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn formats_imf_fixdate() {
        assert_eq!(&super::format(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&super::format(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&super::format(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&super::format(1_796_083_199), b"Mon, 30 Nov 2026 23:59:59 GMT");
    }
}
