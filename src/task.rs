//! Cooperative scheduling helpers for the shards' monoio event loops.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

thread_local! {
    /// This thread's heartbeat (ms since the epoch given), if it is a shard's.
    static BEAT: RefCell<Option<(Arc<AtomicU64>, Instant)>> = const { RefCell::new(None) };
}

/// Makes this thread's turns stamp `beat` with the milliseconds since `epoch`: a busy loop that
/// yields is a core that turns, even while timers (the periodic heartbeat) wait behind it.
pub fn set_heartbeat(beat: Arc<AtomicU64>, epoch: Instant) {
    BEAT.with(|b| *b.borrow_mut() = Some((beat, epoch)));
}

/// Stamps this thread's heartbeat, if it has one, and lets the heavy lane's first waiter in
/// if its share of the core has come (timers do not fire while the loop stays busy).
pub fn beat() {
    active();
    let now = Instant::now();
    BEAT.with(|b| {
        if let Some((beat, epoch)) = &*b.borrow() {
            beat.store(now.duration_since(*epoch).as_millis() as u64, Ordering::Relaxed);
        }
    });
    lane_tick(now);
}

/// Gives the event loop a turn: resolves after every task already queued on this thread has
/// run, and after the driver has had a chance to poll for I/O.
///
/// Waking oneself inside `poll` is not enough in monoio 0.2.4: a task notified while it runs
/// is pushed to the *front* of the run queue and polled again at once, so other tasks (and
/// epoll) never get their turn. The wake therefore comes from a small task spawned at the back
/// of the queue. Needed because on the epoll driver a read or write whose socket is known to
/// be ready completes without ever returning `Pending`: a loop over a client that always has
/// more bytes waiting (pipelined requests, a stream of frames) would otherwise hold the core.
///
/// monoio runs timers only when its run queue has drained, and a loop of tasks that always
/// yield never lets it drain: every timeout, deadline and timer of the thread (write timeouts,
/// long-poll waits, pings) would wait until the flood ends. So once this thread's timers are
/// `TIMERS_LATE` (200 ms) overdue (see [`timers_ran`]), a yield waits for the queue to drain
/// instead.
pub async fn yield_now() {
    beat();
    let late = TIMERS_RAN.with(Cell::get).is_some_and(|t| t.elapsed() > TIMERS_LATE);
    if late {
        // Fires once the run queue drains: every yielding task waits here, so it does.
        return monoio::time::sleep(Duration::ZERO).await;
    }
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        let waker = cx.waker().clone();
        monoio::spawn(async move { waker.wake() });
        Poll::Pending
    })
    .await
}

thread_local! {
    /// When this thread's timers last ran, if a periodic timer task says so ([`timers_ran`]).
    static TIMERS_RAN: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How late this thread's timers may run before [`yield_now`] lets the run queue drain.
const TIMERS_LATE: Duration = Duration::from_millis(200);

/// Says that this thread's timers just ran: called by a task woken by a periodic timer (the
/// shard's heartbeat, every 100 ms), it is how [`yield_now`] tells that timers are overdue.
pub fn timers_ran() {
    TIMERS_RAN.with(|t| t.set(Some(Instant::now())));
}

/// Work a loop over a client-controlled collection (the consumers and live subscriptions of
/// a topic a publish fans out to) does before it yields: see [`Slice`].
pub const SLICE: Duration = Duration::from_micros(500);

/// Times a loop's work since its last yield: [`Slice::next`] yields once it is over [`SLICE`].
pub struct Slice(Instant);

impl Slice {
    pub fn start() -> Self {
        Slice(Instant::now())
    }

    /// Yields if this slice is used up (one clock reading otherwise).
    pub async fn next(&mut self) {
        if self.0.elapsed() > SLICE {
            yield_now().await;
            self.0 = Instant::now();
        }
    }
}

/// A first-come-first-served gate on one thread: work that may yield half-way but must not
/// interleave with the next of its kind (fan-outs of a topic's events, in offset order) passes
/// one at a time, in the order places were taken ([`Gate::join`], synchronous, so a place can
/// be taken where the order is decided and used later in a spawned task). Uncontended,
/// entering costs no wait.
#[derive(Default)]
pub struct Gate {
    inner: RefCell<GateState>,
}

#[derive(Default)]
struct GateState {
    /// The ticket now served: the first slot's.
    serving: u64,
    /// One slot per place taken and not yet done, in ticket order from `serving`: the waker of
    /// one waiting, and whether its holder went away before its turn (skipped when it comes).
    slots: VecDeque<(Option<Waker>, bool)>,
}

/// A place in a [`Gate`]'s line. Once [`Place::enter`] resolves it holds the gate until dropped;
/// dropped before its turn, it gives the place up.
pub struct Place {
    gate: Rc<Gate>,
    ticket: u64,
}

impl Gate {
    /// Takes the next place in line.
    pub fn join(gate: &Rc<Gate>) -> Place {
        let mut g = gate.inner.borrow_mut();
        g.slots.push_back((None, false));
        Place { gate: gate.clone(), ticket: g.serving + g.slots.len() as u64 - 1 }
    }
}

impl GateState {
    fn slot(&mut self, ticket: u64) -> &mut (Option<Waker>, bool) {
        let i = (ticket - self.serving) as usize;
        &mut self.slots[i]
    }
}

impl Place {
    /// Waits until it is this place's turn.
    pub async fn enter(&self) {
        poll_fn(|cx| {
            let mut g = self.gate.inner.borrow_mut();
            if g.serving == self.ticket {
                return Poll::Ready(());
            }
            g.slot(self.ticket).0 = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let next = {
            let mut g = self.gate.inner.borrow_mut();
            if g.serving != self.ticket {
                *g.slot(self.ticket) = (None, true);
                return;
            }
            g.slots.pop_front();
            g.serving += 1;
            while g.slots.front().is_some_and(|s| s.1) {
                g.slots.pop_front();
                g.serving += 1;
            }
            g.slots.front_mut().and_then(|s| s.0.take())
        };
        if let Some(w) = next {
            w.wake();
        }
    }
}

/// Requests (or session reads) one connection may take in a row before it yields.
pub const TURN: u32 = 8;

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
    /// Polls of metered tasks and turns given by [`yield_now`] on this thread: the heavy lane
    /// reads it to tell an idle core from one where other work is waiting.
    static ACTIVITY: Cell<u64> = const { Cell::new(0) };
    /// Whether a metered task is being polled (its poll counted once in [`ACTIVITY`]).
    static IN_METERED: Cell<bool> = const { Cell::new(false) };
}

fn active() {
    ACTIVITY.with(|a| a.set(a.get().wrapping_add(1)));
}

fn activity() -> u64 {
    ACTIVITY.with(Cell::get)
}

impl Lane {
    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.refilled).as_nanos() as i128 * HEAVY_SHARE as i128 / 100;
        self.credit = (self.credit + earned).min(HEAVY_BURST.as_nanos() as i128);
        self.refilled = now;
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
fn lane_tick(now: Instant) {
    let _ = LANE.try_with(|l| {
        let Ok(mut l) = l.try_borrow_mut() else { return };
        if l.due.is_some_and(|d| d <= now) {
            l.due = None;
            l.wake_first();
        }
    });
}

/// Charges `cost` of heavy work done on this thread to its heavy lane.
pub fn charge(cost: Duration) {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        l.refill(Instant::now());
        l.credit -= cost.as_nanos() as i128;
    });
}

/// Whether heavy work on this thread is over its share or waiting: a new connection then
/// waits its [`turn`] before its first request (it may be one more costly client).
pub fn lane_busy() -> bool {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        l.refill(Instant::now());
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
        l.handling.push((id, Instant::now()));
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
/// poll or [`yield_now`]. When a trip sees other work, the waiter waits for a zero timer first
/// (monoio runs timers only once its run queue has drained), so it never keeps the loop busy.
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
            let now = Instant::now();
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Regression: a task that woke itself was polled again before anything else, so a
    /// busy connection starved every other one on its shard.
    #[test]
    fn a_yielding_task_lets_every_queued_task_run_first() {
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().build().unwrap().block_on(async move {
            let busy = {
                let o = o.clone();
                monoio::spawn(async move {
                    for i in 0..3 {
                        o.borrow_mut().push(format!("busy{i}"));
                        super::yield_now().await;
                    }
                })
            };
            let other = {
                let o = o.clone();
                monoio::spawn(async move { o.borrow_mut().push("other".to_string()) })
            };
            busy.await;
            other.await;
        });
        let order = order.borrow();
        let other = order.iter().position(|s| s == "other").unwrap();
        assert!(other <= 1, "the other task ran after the busy one's first turn: {order:?}");
    }

    /// Regression: a loop of tasks that always yield never let monoio's run queue drain, so
    /// no timer of the thread fired while it lasted (a long-poll of 200 ms answered after 24 s
    /// beside a pipelining client). Once timers are overdue, yields let the queue drain.
    #[test]
    fn timers_fire_while_tasks_keep_yielding() {
        let fired = Rc::new(std::cell::Cell::new(false));
        let f = fired.clone();
        runtime().block_on(async move {
            super::timers_ran();
            let timer = monoio::spawn(async move {
                monoio::time::sleep(std::time::Duration::from_millis(20)).await;
                f.set(true);
            });
            let started = std::time::Instant::now();
            while !fired.get() && started.elapsed() < std::time::Duration::from_secs(10) {
                super::yield_now().await;
            }
            assert!(fired.get(), "the timer never fired while this task kept yielding");
            timer.await;
        });
    }

    fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::LegacyDriver>> {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().unwrap()
    }

    #[test]
    fn a_lane_in_credit_lets_a_turn_in_at_once() {
        runtime().block_on(async {
            super::charge(std::time::Duration::from_millis(1));
            assert!(!super::lane_busy());
            super::turn().await;
        });
    }

    /// With the credit spent, waiters get in only when the core is idle, in arrival order.
    #[test]
    fn waiters_get_in_first_come_first_served_on_an_idle_core() {
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        runtime().block_on(async move {
            super::charge(std::time::Duration::from_secs(10));
            assert!(super::lane_busy());
            let waiters: Vec<_> = (0..3)
                .map(|i| {
                    let o = o.clone();
                    monoio::spawn(async move {
                        super::turn().await;
                        o.borrow_mut().push(i);
                    })
                })
                .collect();
            for w in waiters {
                w.await;
            }
        });
        assert_eq!(*order.borrow(), [0, 1, 2]);
    }

    /// A core that keeps turning (a task that yields, a stand-in for light requests) is not
    /// idle: the waiter stays out until that work is done (its share of 10 s would take 40 s).
    #[test]
    fn a_busy_core_keeps_a_waiter_out() {
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        runtime().block_on(async move {
            super::charge(std::time::Duration::from_secs(10));
            let waiter = {
                let o = o.clone();
                monoio::spawn(async move {
                    super::turn().await;
                    o.borrow_mut().push("waiter");
                })
            };
            let busy = {
                let o = o.clone();
                monoio::spawn(async move {
                    for _ in 0..2000 {
                        super::yield_now().await;
                    }
                    o.borrow_mut().push("busy done");
                })
            };
            busy.await;
            waiter.await;
        });
        assert_eq!(*order.borrow(), ["busy done", "waiter"]);
    }

    /// A request let out of the lane and still being handled (here: waiting on a timer, the
    /// core idle meanwhile) keeps the next waiter out until it is done...
    #[test]
    fn a_request_being_handled_keeps_the_next_waiter_out() {
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        runtime().block_on(async move {
            super::charge(std::time::Duration::from_secs(10));
            let handling = super::handling();
            let waiter = {
                let o = o.clone();
                monoio::spawn(async move {
                    super::turn().await;
                    o.borrow_mut().push("waiter");
                })
            };
            monoio::time::sleep(std::time::Duration::from_millis(20)).await;
            o.borrow_mut().push("handled");
            drop(handling);
            waiter.await;
        });
        assert_eq!(*order.borrow(), ["handled", "waiter"]);
    }

    /// ... but only for a while (a long-poll waits for up to a minute).
    #[test]
    fn a_long_handled_request_stops_holding_the_lane() {
        runtime().block_on(async move {
            super::charge(std::time::Duration::from_secs(10));
            let _long_poll = super::handling();
            let waiter = monoio::spawn(super::turn());
            let limit = std::time::Duration::from_secs(10);
            assert!(monoio::time::timeout(limit, waiter).await.is_ok(), "the waiter never got in");
        });
    }

    /// A waiter whose connection went away does not hold the line.
    #[test]
    fn a_waiter_that_goes_away_lets_the_next_in() {
        runtime().block_on(async {
            super::charge(std::time::Duration::from_secs(10));
            let _busy = super::handling(); // so nobody gets in as long as the first is in line
            let mut first = Box::pin(super::turn());
            assert!(futures::poll!(&mut first).is_pending());
            let mut second = Box::pin(super::turn());
            assert!(futures::poll!(&mut second).is_pending(), "the second is queued behind the first");
            drop(first);
            let limit = std::time::Duration::from_secs(10);
            assert!(monoio::time::timeout(limit, second).await.is_ok(), "the second never got in");
        });
    }

    /// One leaving from the middle of the line is skipped when its turn comes.
    #[test]
    fn a_waiter_leaving_from_the_middle_is_skipped() {
        runtime().block_on(async {
            super::charge(std::time::Duration::from_secs(10));
            let held = super::handling(); // nobody gets in while the line forms
            let mut first = Box::pin(super::turn());
            let mut second = Box::pin(super::turn());
            let mut third = Box::pin(super::turn());
            for w in [&mut first, &mut second, &mut third] {
                assert!(futures::poll!(w).is_pending());
            }
            drop(second);
            drop(held);
            let limit = std::time::Duration::from_secs(10);
            assert!(monoio::time::timeout(limit, first).await.is_ok(), "the first never got in");
            assert!(monoio::time::timeout(limit, third).await.is_ok(), "the third waited for one who left");
        });
    }

    /// Fan-outs of a topic may yield half-way; the gate keeps them whole and in order.
    #[test]
    fn a_gate_lets_entrants_through_one_at_a_time_in_arrival_order() {
        let order = Rc::new(RefCell::new(Vec::new()));
        let o = order.clone();
        runtime().block_on(async move {
            let gate = Rc::new(super::Gate::default());
            let entrants: Vec<_> = (0..3)
                .map(|i| {
                    let (o, place) = (o.clone(), super::Gate::join(&gate));
                    monoio::spawn(async move {
                        place.enter().await;
                        o.borrow_mut().push(format!("{i} in"));
                        for _ in 0..3 {
                            super::yield_now().await;
                        }
                        o.borrow_mut().push(format!("{i} out"));
                        drop(place);
                    })
                })
                .collect();
            // Places taken in order 0, 1, 2 are served in that order, however the tasks run.
            for e in entrants.into_iter().rev() {
                e.await;
            }
        });
        assert_eq!(*order.borrow(), ["0 in", "0 out", "1 in", "1 out", "2 in", "2 out"]);
    }

    #[test]
    fn a_gate_entrant_that_goes_away_gives_up_its_place() {
        runtime().block_on(async {
            let gate = Rc::new(super::Gate::default());
            let first = super::Gate::join(&gate);
            first.enter().await;
            let second = super::Gate::join(&gate);
            let third = super::Gate::join(&gate);
            {
                let mut waiting = Box::pin(third.enter());
                assert!(futures::poll!(&mut waiting).is_pending());
            }
            drop(second);
            drop(first);
            let mut entering = Box::pin(third.enter());
            assert!(futures::poll!(&mut entering).is_ready(), "the third waited for one who left");
        });
    }
}
