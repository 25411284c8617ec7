//! The shard thread's clock: one reading per poll instead of one per question.
//!
//! A publish used to read the clock about fifteen times (the meter's two per poll, the heavy
//! lane, the heartbeat, the latency metric, the event's timestamp, the `Date` header), at
//! 40-50 ns each on this project's machines: 5% of a publish's CPU. Now [`now`] reads it and
//! keeps the reading; [`recent`] answers from the last reading on this thread without a read.
//! A metered poll ([`super::metered`]) reads it as it starts, so inside a connection's or a
//! session's poll `recent` is at most that poll old. Outside a metered poll the last reading
//! may be as old as the loop's last sleep: code there calls [`now`] (or [`fresh`], which
//! reads only outside a metered poll).
//!
//! Wall-clock time (an event's `time` of arrival, stored) is [`wall_micros`]: the monotonic
//! reading mapped through a wall-clock reading taken at most [`WALL_EVERY`] ago, so a step of
//! the system clock is followed within that.

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How old the wall-clock reading [`wall_micros`] maps through may be.
pub const WALL_EVERY: Duration = Duration::from_millis(100);

thread_local! {
    /// Whether a metered task is being polled (its poll counted once in the heavy lane's
    /// activity count).
    pub(super) static IN_METERED: Cell<bool> = const { Cell::new(false) };
    static RECENT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// A wall-clock reading (µs since the Unix epoch), the monotonic one taken with it, and the
    /// last value [`wall_micros`] gave (what it never goes under).
    static WALL: Cell<Option<(i64, Instant, i64)>> = const { Cell::new(None) };
}

/// Reads the monotonic clock, and keeps the reading as this thread's recent one.
pub fn now() -> Instant {
    let t = Instant::now();
    RECENT.set(Some(t));
    t
}

/// This thread's last reading (inside a metered poll: that poll's start, or later), reading
/// the clock only if there was none.
pub fn recent() -> Instant {
    RECENT.get().unwrap_or_else(now)
}

/// [`recent`] inside a metered poll, [`now`] outside one (where the last reading may be from
/// before the loop last slept).
pub fn fresh() -> Instant {
    if IN_METERED.get() {
        recent()
    } else {
        now()
    }
}

/// Microseconds from `start` to a new reading (0 if the clock went back past it).
pub fn micros_since(start: Instant) -> u64 {
    now().saturating_duration_since(start).as_micros() as u64
}

/// Microseconds since the Unix epoch, at [`fresh`]'s instant; the system clock is read at most
/// once per [`WALL_EVERY`]. Never less than the last value on this thread (a new pair read a
/// little off does not step back). After a suspend (the monotonic clock stood still) it is
/// behind for up to [`WALL_EVERY`].
pub fn wall_micros() -> i64 {
    let t = fresh();
    let (wall, at, floor) = match WALL.get() {
        Some((wall, at, floor)) if t >= at && t - at < WALL_EVERY => (wall, at, floor),
        last => {
            let (wall, at) = wall_pair();
            // Kept as the recent reading, so that `t` is not older than the pair for the rest
            // of this poll.
            RECENT.set(Some(recent().max(at)));
            (wall, at, last.map_or(i64::MIN, |l| l.2))
        }
    };
    let mapped = match t >= at {
        true => wall + (t - at).as_micros() as i64,
        false => wall - (at - t).as_micros() as i64,
    };
    let out = mapped.max(floor);
    WALL.set(Some((wall, at, out)));
    out
}

/// The system clock and the monotonic instant it was read at: the monotonic clock read on both
/// sides, the pair taken from a reading whose sides are within 100 µs (a thread descheduled
/// between two reads would otherwise put the pair that far off), after three tries whatever
/// came.
fn wall_pair() -> (i64, Instant) {
    let mut tries = 0;
    loop {
        tries += 1;
        let before = Instant::now();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        let after = Instant::now();
        if after - before < Duration::from_micros(100) || tries == 3 {
            return (wall, before + (after - before) / 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `recent` is the last reading until the next one; `wall_micros` stays within a
    /// millisecond of the system clock, and never goes back on one thread.
    #[test]
    fn recent_is_the_last_reading_and_wall_time_follows_the_system_clock() {
        let t = now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(recent(), t);
        assert!(now() > t);
        let mut last = 0;
        let system = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
        for _ in 0..50 {
            let (before, ours, after) = (system(), wall_micros(), system());
            assert!(
                ours >= before - 1_000 && ours <= after + 1_000,
                "{ours} against the system clock's {before}..{after}"
            );
            assert!(ours >= last);
            last = ours;
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
