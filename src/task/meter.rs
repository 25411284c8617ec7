//! Metering: [`metered`] runs a task and adds the core time each of its polls takes to its
//! [`Meter`] (what tells a heavy request from a light one); each poll also counts as activity
//! for the heavy lane and lets its first waiter in when its share has come.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::time::{Duration, Instant};

use super::lane::{active, lane_tick, IN_METERED};

/// The core time one task has taken, measured around each of its polls (see [`metered`]).
#[derive(Default)]
pub struct Meter {
    spent: Cell<Duration>,
    /// When the poll in progress began, if one is.
    polling: Cell<Option<Instant>>,
}

impl Meter {
    /// The core time taken since the last `take`, the poll in progress included.
    pub fn take(&self) -> Duration {
        let mut spent = self.spent.replace(Duration::ZERO);
        if let Some(t) = self.polling.get() {
            let now = Instant::now();
            spent += now - t;
            self.polling.set(Some(now));
        }
        spent
    }
}

/// Runs `f`, adding the time each of its polls takes to `meter`. Two clock readings per poll.
pub async fn metered<F: Future>(meter: &Meter, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    poll_fn(|cx| {
        active();
        meter.polling.set(Some(Instant::now()));
        let outer = IN_METERED.replace(true);
        let r = f.as_mut().poll(cx);
        IN_METERED.set(outer);
        let now = Instant::now();
        if let Some(t) = meter.polling.take() {
            meter.spent.set(meter.spent.get() + (now - t));
        }
        lane_tick(now);
        r
    })
    .await
}
