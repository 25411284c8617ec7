//! Metering: [`metered`] runs a task and adds the core time each of its polls takes to its
//! [`Meter`] (what tells a heavy request from a light one); each poll also counts as activity
//! for the heavy lane and lets its first waiter in when its share has come.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::clock::{self, IN_METERED};
use super::lane::{active, lane_tick};

/// The core time one task has taken, measured around each of its polls (see [`metered`]).
#[derive(Default)]
pub struct Meter {
    spent: Cell<Duration>,
    /// When the poll in progress began, if one is.
    polling: Cell<Option<Instant>>,
}

impl Meter {
    /// The core time taken since the last `take`, the poll in progress included (a clock
    /// reading: the request just handled in this poll is what tells a heavy one).
    pub fn take(&self) -> Duration {
        let mut spent = self.spent.replace(Duration::ZERO);
        if let Some(t) = self.polling.get() {
            let now = clock::now();
            spent += now - t;
            self.polling.set(Some(now));
        }
        spent
    }
}

/// Runs `f`, adding the time each of its polls takes to `meter`. Two clock readings per poll.
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
        this.meter.polling.set(Some(clock::now()));
        let outer = IN_METERED.replace(true);
        let r = this.f.poll(cx);
        IN_METERED.set(outer);
        let now = clock::now();
        if let Some(t) = this.meter.polling.take() {
            this.meter.spent.set(this.meter.spent.get() + (now - t));
        }
        lane_tick(now);
        r
    }
}
