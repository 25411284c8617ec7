//! The shard thread's clock: at most one reading per poll instead of one per question, and a
//! cheaper counter for metering polls.
//!
//! A publish used to read the clock about fifteen times (the meter's two per poll, the heavy
//! lane, the heartbeat, the latency metric, the event's timestamp, the `Date` header), at
//! 40-50 ns each on this project's machines: 5% of a publish's CPU. Now [`now`] reads it and
//! keeps the reading; [`recent`] answers from the last reading on this thread. A metered poll
//! ([`super::metered`]) marks that reading stale as it starts (and as each request it handles
//! ends: [`super::Meter::take`]), so inside a connection's or a session's poll the first
//! question reads the clock and the others share that reading: a poll that asks nothing reads
//! nothing. Outside a metered poll the last reading may be as old
//! as the loop's last sleep: code there calls [`now`] (or [`fresh`], which reads only outside
//! a metered poll).
//!
//! The meter itself counts [`ticks`]: the CPU's time-stamp counter where the kernel keeps time
//! with it (about half a clock read, and no conversion per poll), turned into time only when a
//! meter is read ([`ticks_duration`]).
//!
//! Wall-clock time (an event's `time` of arrival, stored) is [`wall_micros`]: the monotonic
//! reading mapped through a wall-clock reading taken at most [`WALL_EVERY`] ago, so a step of
//! the system clock is followed within that.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How old the wall-clock reading [`wall_micros`] maps through may be.
pub const WALL_EVERY: Duration = Duration::from_millis(100);

thread_local! {
    /// Whether a metered task is being polled (its poll counted once in the heavy lane's
    /// activity count).
    pub(super) static IN_METERED: Cell<bool> = const { Cell::new(false) };
    static RECENT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// A metered poll began since [`RECENT`] was read: the next question reads the clock.
    static STALE: Cell<bool> = const { Cell::new(false) };
    /// A wall-clock reading (µs since the Unix epoch), the monotonic one taken with it, and the
    /// last value [`wall_micros`] gave (what it never goes under).
    static WALL: Cell<Option<(i64, Instant, i64)>> = const { Cell::new(None) };
}

/// Reads the monotonic clock, and keeps the reading as this thread's recent one.
pub fn now() -> Instant {
    let t = Instant::now();
    RECENT.set(Some(t));
    STALE.set(false);
    t
}

/// This thread's last reading, read now if there was none or a metered poll began since
/// (inside a metered poll it is never older than that poll).
pub fn recent() -> Instant {
    match RECENT.get() {
        Some(t) if !STALE.get() => t,
        _ => now(),
    }
}

/// A metered poll begins, or a request handled in it ended ([`super::Meter::take`]): the next
/// [`recent`] reads the clock.
pub(super) fn mark_stale() {
    STALE.set(true);
}

/// A count that only goes up on one thread, for metering polls: the time-stamp counter (x86-64,
/// where the kernel's clocksource is `tsc`: constant rate, in step across cores), else
/// nanoseconds of the monotonic clock. Never 0. Only differences on one thread mean anything,
/// and [`ticks_duration`] says how long they are.
#[inline]
pub fn ticks() -> u64 {
    match tsc_nanos().and_then(|_| crate::sys::tsc()) {
        Some(t) => t | 1,
        None => Instant::now().saturating_duration_since(epoch()).as_nanos() as u64 + 1,
    }
}

/// How long `n` [`ticks`] are.
pub fn ticks_duration(n: u64) -> Duration {
    match tsc_nanos() {
        Some(per_tick) => Duration::from_nanos((n as f64 * per_tick) as u64),
        None => Duration::from_nanos(n),
    }
}

/// How many [`ticks`] `d` is.
pub fn ticks_for(d: Duration) -> u64 {
    match tsc_nanos() {
        Some(per_tick) => (d.as_nanos() as f64 / per_tick) as u64,
        None => d.as_nanos() as u64,
    }
}

/// Measures the time-stamp counter's rate, if [`ticks`] uses it; done when the runtime starts
/// (a couple of milliseconds), else on the first use.
pub fn calibrate() {
    let _ = tsc_nanos();
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds per tick of the time-stamp counter, if [`ticks`] counts with it.
fn tsc_nanos() -> Option<f64> {
    static PER_TICK: OnceLock<Option<f64>> = OnceLock::new();
    *PER_TICK.get_or_init(measure_tsc)
}

/// The counter's rate against the monotonic clock over 2 ms, from readings of the clock taken
/// between two of the counter's close together (a thread descheduled between them would put
/// the pair off); `None` without a counter ([`crate::sys::tsc`]), or where the kernel does not
/// keep time with it itself (it may then stop, or differ between cores).
fn measure_tsc() -> Option<f64> {
    crate::sys::tsc()?;
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    if source.ok()?.trim() != "tsc" {
        return None;
    }
    let rdtsc = || crate::sys::tsc().unwrap_or(0);
    let pair = || {
        let mut best = None;
        for _ in 0..5 {
            let (a, t, b) = (rdtsc(), Instant::now(), rdtsc());
            let width = b.wrapping_sub(a);
            if best.is_none_or(|(w, _, _)| width < w) {
                best = Some((width, t, a + width / 2));
            }
        }
        best.map(|(_, t, c)| (t, c)).expect("five tries")
    };
    let (t0, c0) = pair();
    while t0.elapsed() < Duration::from_millis(2) {
        std::hint::spin_loop();
    }
    let (t1, c1) = pair();
    let ticks = c1.checked_sub(c0).filter(|&n| n > 0)?;
    Some((t1 - t0).as_nanos() as f64 / ticks as f64)
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
