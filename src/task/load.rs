//! How busy this thread's loop has been lately: the share of the last [`WINDOW`] its metered
//! polls took ([`has_time`]). Work that can be batched (the embedded log's group commit) is
//! done at once while the core has time, and batched only under load, where the batch saves
//! more CPU than it costs in latency.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

use super::clock;

/// How long a window of the measure is: long enough to hold a few requests at low rates, short
/// enough to follow a burst within a couple of milliseconds. Tests use longer windows, so a
/// thread descheduled between two questions is not a window gone by.
pub(super) const WINDOW: Duration = Duration::from_millis(if cfg!(test) { 20 } else { 1 });

/// The share of a window (percent) the metered polls take before the core counts as loaded,
/// and the share under which a loaded core has time again: work done at once costs more of the
/// core than batched (a `pwrite` per publish), so the way back is lower, or the core would
/// go to and fro at a load between the two.
const LOADED_PERCENT: u64 = 50;
const UNLOADED_PERCENT: u64 = 40;

thread_local! {
    /// Ticks spent in metered polls since the window began, and when it began.
    static BUSY: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// What the last whole window said.
    static LOADED: Cell<bool> = const { Cell::new(false) };
}

/// Adds a metered poll's ticks to the window.
pub(super) fn add_busy(ticks: u64) {
    BUSY.with(|b| {
        let (busy, start) = b.get();
        b.set((busy + ticks, start));
    });
}

/// Whether this thread's metered polls took under half of the last whole window (under 40%
/// once the core counted as loaded), with one read of the time-stamp counter. A window ends
/// when it is asked after [`WINDOW`] has passed, so an idle stretch counts as one window with
/// little work in it.
pub fn has_time() -> bool {
    let now = clock::ticks();
    let (busy, start) = BUSY.get();
    let elapsed = now.saturating_sub(start);
    if elapsed >= window_ticks() {
        LOADED.set(loaded(LOADED.get(), busy, elapsed));
        BUSY.set((0, now));
    }
    !LOADED.get()
}

/// Whether a window with `busy` of its `elapsed` ticks in metered polls leaves the core loaded,
/// given whether it was.
fn loaded(was: bool, busy: u64, elapsed: u64) -> bool {
    let limit = if was { UNLOADED_PERCENT } else { LOADED_PERCENT };
    busy * 100 > elapsed * limit
}

fn window_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| clock::ticks_for(WINDOW))
}

#[cfg(test)]
mod tests {
    /// Between the two shares the core stays as it was: loaded from half, with time again only
    /// under 40%.
    #[test]
    fn a_loaded_core_has_time_again_only_under_the_lower_share() {
        for (was, busy, now) in [(false, 45, false), (false, 51, true), (true, 45, true), (true, 39, false)] {
            assert_eq!(super::loaded(was, busy, 100), now, "was loaded: {was}, busy {busy}%");
        }
    }
}
