//! Metering: [`metered`] runs a task and adds the core time each of its polls takes to its
//! [`Meter`] (what tells a heavy request from a light one); each poll also counts as activity
//! for the heavy lane and lets its first waiter in when its share has come.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::clock::{self, IN_METERED};
use super::lane::{active, lane_tick_if_due};
use super::load::add_busy;

/// The core time one task has taken, measured around each of its polls (see [`metered`]), in
/// [`clock::ticks`].
#[derive(Default)]
pub struct Meter {
    spent: Cell<u64>,
    /// When the poll in progress began (0: none is).
    polling: Cell<u64>,
}

impl Meter {
    /// The core time taken since the last `take`, the poll in progress included (the request
    /// just handled in this poll is what tells a heavy one). Called as each request ends, it
    /// also marks the thread's clock reading stale: the next request's first question of the
    /// time reads the clock.
    pub fn take(&self) -> Duration {
        clock::mark_stale();
        let mut spent = self.spent.replace(0);
        let began = self.polling.get();
        if began != 0 {
            let now = clock::ticks();
            spent += now.saturating_sub(began);
            self.polling.set(now);
        }
        clock::ticks_duration(spent)
    }
}

/// Runs `f`, adding the time each of its polls takes to `meter`: two reads of the time-stamp
/// counter per poll, no clock reading (the poll's first question of the time reads the clock:
/// see [`clock`]).
/// A future of its own holding `f` once (an `async fn` would keep room for its argument and
/// for the pinned copy, in every idle session).
pub fn metered<F: Future>(meter: &Meter, f: F) -> Metered<'_, F> {
    Metered { meter, f }
}

pin_project_lite::pin_project! {
    /// `f` with its polls metered (see [`metered`]).
    pub struct Metered<'a, F> {
        meter: &'a Meter,
        #[pin]
        f: F,
    }
}

impl<F: Future> Future for Metered<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        active();
        let start = clock::ticks();
        this.meter.polling.set(start);
        clock::mark_stale();
        let outer = IN_METERED.replace(true);
        let r = this.f.poll(cx);
        IN_METERED.set(outer);
        let (began, end) = (this.meter.polling.replace(0), clock::ticks());
        if began != 0 {
            this.meter.spent.set(this.meter.spent.get() + end.saturating_sub(began));
        }
        if !outer {
            // The whole poll: requests that ended in it were taken from the meter already.
            add_busy(end.saturating_sub(start));
        }
        lane_tick_if_due();
        r
    }
}
