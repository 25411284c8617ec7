//! Connection timeouts without a timer entry per read or write: one sweep per shard thread.
//!
//! [`within`] puts the operation's deadline in a slot of the thread's table (a `Vec` with a free
//! list: no allocation once it has grown to the connections in flight) and takes it out when the
//! operation ends; the table's sweep task, started on the thread's first use, wakes every
//! [`TICK`] and fails the operations whose deadline passed. A deadline is set from a clock read
//! when its operation first waits (an operation done at once costs none), never from the
//! sweep's last reading: that one is as old as the longest stall of the thread (a long
//! request, a blocking call), and a deadline set from it would fire early by that much. So a
//! timeout fires between its time and a tick after it (or after a stall ends): fine for
//! timeouts of seconds (and tests' hundreds of milliseconds), which is all the connection loop
//! uses. The sweep lives as long as the thread's runtime: a thread
//! runs one runtime for its life (each shard's, the admin thread's `runtime::block_on`); a second
//! runtime on the same thread would find no sweep (monoio does not drop the first one's tasks). Before: a `monoio::time::timeout` per read and per write,
//! each a clock read and a timer-wheel insert and removal. Once a second the sweep also hands
//! the thread's empty heap pages back (`sys::collect_heap`).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often the sweep looks at the deadlines.
pub const TICK: Duration = Duration::from_millis(10);

/// The operation did not finish in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

#[derive(Default)]
struct Slot {
    at: Option<Instant>,
    waker: Option<Waker>,
    fired: bool,
}

#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// No deadline in the table is earlier (a lower bound: a slot given back does not raise
    /// it): a tick before it does not look at the slots at all, so idle connections, whose
    /// deadlines are far, cost the sweep nothing most ticks.
    earliest: Option<Instant>,
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::default();
    /// The sweep's clock: `None` until this thread's sweep started.
    static NOW: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The thread's coarse clock (the sweep's last reading, at most a [`TICK`] old), starting the
/// sweep on first use.
pub fn now() -> Instant {
    if let Some(t) = NOW.get() {
        return t;
    }
    let t = Instant::now();
    NOW.set(Some(t));
    monoio::spawn(sweep());
    t
}

async fn sweep() {
    let mut second = 0;
    loop {
        monoio::time::sleep(TICK).await;
        let t = crate::task::clock::now();
        NOW.set(Some(t));
        let now_second = (crate::task::clock::wall_micros() / 1_000_000) as u64;
        crate::http::date::tick(now_second);
        if now_second != second {
            second = now_second;
            crate::sys::collect_heap();
        }
        let due: Vec<Waker> = TABLE.with_borrow_mut(|table| {
            if table.earliest.is_none_or(|e| e > t) {
                return Vec::new();
            }
            let mut due = Vec::new();
            let mut earliest = None;
            for s in &mut table.slots {
                match s.at {
                    Some(at) if at <= t => {
                        s.at = None;
                        s.fired = true;
                        due.extend(s.waker.take());
                    }
                    Some(at) => earliest = Some(earliest.map_or(at, |e: Instant| e.min(at))),
                    None => {}
                }
            }
            table.earliest = earliest;
            due
        });
        for w in due {
            w.wake();
        }
    }
}

/// `f`, or [`Elapsed`] once `timeout` has passed (by the sweep's clock).
pub fn within<F: Future>(timeout: Duration, f: F) -> Within<F> {
    Within { f, timeout, slot: None }
}

pin_project_lite::pin_project! {
    /// The future [`within`] returns.
    pub struct Within<F> {
        #[pin]
        f: F,
        timeout: Duration,
        slot: Option<usize>,
    }

    impl<F> PinnedDrop for Within<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(i) = *this.project().slot {
                release(i);
            }
        }
    }
}

fn release(i: usize) {
    TABLE.with_borrow_mut(|table| {
        table.slots[i] = Slot::default();
        table.free.push(i);
    });
}

impl<F: Future> Future for Within<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.f.poll(cx) {
            if let Some(i) = this.slot.take() {
                release(i);
            }
            return Poll::Ready(Ok(v));
        }
        match *this.slot {
            None => {
                // The first use on a thread starts the sweep. The deadline counts from the
                // clock's recent reading: inside a metered poll, taken in that poll since it
                // began or its last request ended (the deadline at most that early).
                now();
                let at = crate::task::clock::fresh() + *this.timeout;
                let slot = Slot { at: Some(at), waker: Some(cx.waker().clone()), fired: false };
                *this.slot = Some(TABLE.with_borrow_mut(|table| {
                    table.earliest = Some(table.earliest.map_or(at, |e| e.min(at)));
                    match table.free.pop() {
                        Some(i) => {
                            table.slots[i] = slot;
                            i
                        }
                        None => {
                            table.slots.push(slot);
                            table.slots.len() - 1
                        }
                    }
                }));
                Poll::Pending
            }
            Some(i) => {
                let fired = TABLE.with_borrow_mut(|table| {
                    let s = &mut table.slots[i];
                    if !s.fired && !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        s.waker = Some(cx.waker().clone());
                    }
                    s.fired
                });
                if fired {
                    *this.slot = None;
                    release(i);
                    return Poll::Ready(Err(Elapsed));
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().expect("runtime").block_on(f)
    }

    /// A deadline set right after the thread stalled (the sweep's clock is as old as the stall)
    /// is not early: it was once set from that clock and fired at the sweep's next tick.
    #[test]
    fn a_deadline_set_after_a_stall_is_not_early() {
        block_on(async {
            now();
            monoio::time::sleep(TICK * 2).await;
            // A blocked thread: the sweep cannot run, its clock grows 1.5 s old.
            std::thread::sleep(Duration::from_millis(1500));
            let r = within(Duration::from_millis(1000), monoio::time::sleep(Duration::from_millis(50))).await;
            assert_eq!(r, Ok(()), "timed out before its second was up");
        })
    }

    /// What finishes in time is returned; what does not fails within a few ticks of its
    /// deadline; slots are reused, so the table stays the size of what is in flight at once.
    #[test]
    fn operations_finish_or_time_out_and_their_slots_are_reused() {
        block_on(async {
            assert_eq!(within(Duration::from_secs(1), async { 7 }).await, Ok(7));
            let started = Instant::now();
            let r = within(Duration::from_millis(50), std::future::pending::<()>()).await;
            let took = started.elapsed();
            assert_eq!(r, Err(Elapsed));
            // Never early by more than the sweep clock's age (no upper bound: the machine may
            // be slow).
            assert!(took >= Duration::from_millis(50) - TICK, "{took:?}");
            let slow = within(Duration::from_millis(30), monoio::time::sleep(Duration::from_millis(5)));
            assert_eq!(slow.await, Ok(()));
            for _ in 0..100 {
                let _ = within(Duration::from_millis(1), monoio::time::sleep(Duration::from_millis(20))).await;
            }
            // A far deadline already waiting does not hide a nearer one added after it.
            let mut far = Box::pin(within(Duration::from_secs(30), std::future::pending::<()>()));
            assert!(futures::poll!(&mut far).is_pending());
            let near = within(Duration::from_millis(30), std::future::pending::<()>()).await;
            assert_eq!(near, Err(Elapsed));
            drop(far);
            // A dropped operation gives its slot back too.
            let mut waiting = Box::pin(within(Duration::from_secs(5), std::future::pending::<()>()));
            assert!(futures::poll!(&mut waiting).is_pending());
            drop(waiting);
            TABLE.with_borrow(|t| {
                assert!(t.slots.len() <= 2, "{} slots", t.slots.len());
                assert!(t.slots.iter().all(|s| s.at.is_none() && s.waker.is_none()));
            });
        });
    }
}
