//! The heavy lane: a connection whose request took more than [`HEAVY`] of the core waits its
//! [`turn`], first come first served, until the core is idle or the lane's guaranteed share
//! has paid for the heavy work so far ([`charge`], [`lane_busy`], [`handling`]). Also this
//! thread's activity count, which metered polls and yields bump and the lane reads to tell an
//! idle core.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::clock::{self, IN_METERED};

/// A request (or turn) that took more of the core than this is heavy: it is charged to the
/// shard's heavy lane ([`charge`]) and its connection waits its [`turn`] before it is served
/// again.
pub const HEAVY: Duration = Duration::from_micros(200);
/// The share of a saturated core heavy work is sure to get (percent). Otherwise it runs when
/// nothing else is waiting for the core.
const HEAVY_SHARE: u32 = 25;
/// Heavy work a lane may bank while the core is free.
const HEAVY_BURST: Duration = Duration::from_millis(20);
/// Trips through the run queue with no other task running that make a core idle: enough for
/// monoio to have polled for I/O in between (it does when a round of its run queue ends).
const IDLE_TRIPS: u32 = 3;
/// How long a request let out of the lane keeps the next waiter out while it is handled
/// ([`Handling`]): long enough for a group commit, short of a long-poll's wait.
const HANDLING_HOLD: Duration = Duration::from_millis(if cfg!(test) { 500 } else { 5 });

/// One shard's heavy lane. Connections whose last request was heavy wait here, first come
/// first served, until either nothing else wants the core (no other task ran for a few trips
/// through the run queue) or the lane's guaranteed share of the core has paid for the heavy
/// work done so far. So however many clients send costly requests, a light request waits
/// behind about one of them at most, and costly clients still get at least [`HEAVY_SHARE`] of
/// a saturated core between them (and all of an idle one).
struct Lane {
    /// Banked core time for heavy work, in ns (negative: owed).
    credit: i128,
    refilled: Instant,
    /// Waiters by ticket, first in line at the front: (ticket, waker, left the line).
    waiting: VecDeque<(u64, Option<Waker>, bool)>,
    next_ticket: u64,
    /// When the first waiter's share will have come, if it waits for it.
    due: Option<Instant>,
    /// Requests let out of the lane still being handled, by id, with when they began (see
    /// [`handling`]).
    handling: Vec<(u64, Instant)>,
    next_handling: u64,
}

thread_local! {
    static LANE: RefCell<Lane> = RefCell::new(Lane {
        credit: HEAVY_BURST.as_nanos() as i128,
        refilled: Instant::now(),
        waiting: VecDeque::new(),
        next_ticket: 0,
        due: None,
        handling: Vec::new(),
        next_handling: 0,
    });
    /// Polls of metered tasks and turns given by [`yield_now`](super::yield_now) on this
    /// thread: the heavy lane reads it to tell an idle core from one where other work is
    /// waiting.
    static ACTIVITY: Cell<u64> = const { Cell::new(0) };
}

pub(super) fn active() {
    ACTIVITY.with(|a| a.set(a.get().wrapping_add(1)));
}

fn activity() -> u64 {
    ACTIVITY.with(Cell::get)
}

impl Lane {
    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.refilled).as_nanos() as i128 * HEAVY_SHARE as i128 / 100;
        self.credit = (self.credit + earned).min(HEAVY_BURST.as_nanos() as i128);
        // A reading older than the last one (the thread's recent reading) earns nothing twice.
        self.refilled = self.refilled.max(now);
    }

    fn first(&self) -> Option<u64> {
        self.waiting.front().map(|w| w.0)
    }

    /// A waiter's entry: tickets are consecutive and leave from the front only.
    fn slot(&mut self, ticket: u64) -> Option<&mut (u64, Option<Waker>, bool)> {
        let first = self.first()?;
        self.waiting.get_mut(ticket.checked_sub(first)? as usize)
    }

    fn wake_first(&mut self) {
        if let Some(w) = self.waiting.front_mut().and_then(|w| w.1.take()) {
            w.wake();
        }
    }

    /// Drops the first waiter and those behind it that left, and wakes the next.
    fn advance(&mut self) {
        self.waiting.pop_front();
        while self.waiting.front().is_some_and(|w| w.2) {
            self.waiting.pop_front();
        }
        self.due = None;
        self.wake_first();
    }

    /// Until when a request let out earlier still keeps the next waiter out, if one does.
    fn held_until(&self, now: Instant) -> Option<Instant> {
        self.handling.iter().map(|&(_, since)| since + HANDLING_HOLD).filter(|&t| t > now).max()
    }
}

/// Wakes the heavy lane's first waiter if its share has come.
pub(super) fn lane_tick(now: Instant) {
    let _ = LANE.try_with(|l| {
        let Ok(mut l) = l.try_borrow_mut() else { return };
        if l.due.is_some_and(|d| d <= now) {
            l.due = None;
            l.wake_first();
        }
    });
}

/// [`lane_tick`] if the lane's first waiter waits for its share (the clock is read only then).
pub(super) fn lane_tick_if_due() {
    let due = LANE.try_with(|l| l.try_borrow().ok().and_then(|l| l.due)).ok().flatten();
    if due.is_some() {
        lane_tick(clock::fresh());
    }
}

/// Charges `cost` of heavy work done on this thread to its heavy lane.
pub fn charge(cost: Duration) {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        l.refill(clock::fresh());
        l.credit -= cost.as_nanos() as i128;
    });
}

/// Whether heavy work on this thread is over its share or waiting: a new connection then
/// waits its [`turn`] before its first request (it may be one more costly client).
pub fn lane_busy() -> bool {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        l.refill(clock::fresh());
        l.credit < 0 || !l.waiting.is_empty()
    })
}

/// A request of a connection that waited its [`turn`], being handled: for up to
/// `HANDLING_HOLD` (5 ms) the heavy lane lets no one else in on an idle core (an admitted publish
/// waiting for the log's group commit is still at work) until it is dropped.
pub struct Handling(u64);

/// Marks the handling of a request let out of the heavy lane (see [`Handling`]).
pub fn handling() -> Handling {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        let id = l.next_handling;
        l.next_handling += 1;
        l.handling.push((id, clock::fresh()));
        Handling(id)
    })
}

impl Drop for Handling {
    fn drop(&mut self) {
        let _ = LANE.try_with(|l| {
            let mut l = l.borrow_mut();
            l.handling.retain(|h| h.0 != self.0);
            l.wake_first();
        });
    }
}

/// Waits for a turn in this thread's heavy lane: first in line, and either the lane's credit
/// covers what it owes or the core is idle. Idle means no request let out of the lane is still
/// being handled ([`handling`], for up to `HANDLING_HOLD`) and `IDLE_TRIPS` trips through
/// the run queue (each woken by a task spawned behind every queued one) saw no other metered
/// poll or [`yield_now`](super::yield_now). When a trip sees other work, the waiter waits for
/// a zero timer first (monoio runs timers only once its run queue has drained), so it never
/// keeps the loop busy.
pub async fn turn() {
    struct Ticket(u64);
    impl Drop for Ticket {
        fn drop(&mut self) {
            // Left the line (served, or its task went away): let the next one in.
            let _ = LANE.try_with(|l| {
                let mut l = l.borrow_mut();
                if l.first() == Some(self.0) {
                    l.advance();
                } else if let Some(w) = l.slot(self.0) {
                    w.2 = true;
                }
            });
        }
    }
    enum Idle {
        /// Trips so far, and the activity count when the last one began.
        Trips(u32, u64),
        /// Other work ran: wait for the run queue to drain first (`false`), or for a request
        /// let out earlier to stop holding the core (`true`).
        Timer(Pin<Box<monoio::time::Sleep>>, bool),
    }
    let ticket = LANE.with(|l| {
        let mut l = l.borrow_mut();
        let t = l.next_ticket;
        l.next_ticket += 1;
        l.waiting.push_back((t, None, false));
        Ticket(t)
    });
    let mut idle: Option<Idle> = None;
    let trip = |cx: &mut std::task::Context<'_>, n: u32| {
        let waker = cx.waker().clone();
        monoio::spawn(async move { waker.wake() });
        Idle::Trips(n, activity())
    };
    poll_fn(|cx| {
        if LANE.with(|l| l.borrow().first()) == Some(ticket.0) {
            let now = clock::fresh();
            let (owed, held) = LANE.with(|l| {
                let mut l = l.borrow_mut();
                l.refill(now);
                ((l.credit < 0).then(|| (-l.credit) as u64 * 100 / HEAVY_SHARE as u64), l.held_until(now))
            });
            let Some(owed) = owed else { return Poll::Ready(()) };
            LANE.with(|l| l.borrow_mut().due = Some(now + Duration::from_nanos(owed)));
            match (held, &idle) {
                (Some(until), _) => {
                    let t = monoio::time::Instant::from_std(until);
                    idle = Some(Idle::Timer(Box::pin(monoio::time::sleep_until(t)), true));
                }
                // The hold ended early (the request was done): look for idle at once.
                (None, Some(Idle::Timer(_, true))) => idle = None,
                _ => {}
            }
            loop {
                match idle.take() {
                    None => idle = Some(trip(cx, 0)),
                    Some(Idle::Trips(n, seen)) => {
                        // This poll itself counted once if it runs inside a metered task.
                        let own = u64::from(IN_METERED.get());
                        if activity().wrapping_sub(seen) > own {
                            idle = Some(Idle::Timer(Box::pin(monoio::time::sleep(Duration::ZERO)), false));
                            continue;
                        }
                        if n + 1 >= IDLE_TRIPS {
                            return Poll::Ready(());
                        }
                        idle = Some(trip(cx, n + 1));
                    }
                    Some(Idle::Timer(mut sleep, hold)) => {
                        if sleep.as_mut().poll(cx).is_ready() {
                            idle = None;
                            continue;
                        }
                        idle = Some(Idle::Timer(sleep, hold));
                    }
                }
                break;
            }
        }
        LANE.with(|l| {
            if let Some(w) = l.borrow_mut().slot(ticket.0) {
                w.1 = Some(cx.waker().clone());
            }
        });
        Poll::Pending
    })
    .await;
    drop(ticket);
}
