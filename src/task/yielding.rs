//! Giving the event loop a turn: [`yield_now`] (after every queued task, and after the timers
//! once they are overdue), [`Slice`] for loops over client-controlled collections, [`TURN`],
//! and the shard's heartbeat, stamped on every turn ([`set_heartbeat`], [`beat`]).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::clock;
use super::lane::{active, lane_tick};

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
    let now = clock::fresh();
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
    // `beat` just took the clock's reading (or, in a metered poll, the poll's).
    let late = TIMERS_RAN.with(Cell::get).is_some_and(|t| clock::recent().saturating_duration_since(t) > TIMERS_LATE);
    if late {
        // Fires once the run queue drains: every yielding task waits here, so it does. Boxed:
        // a timer entry is ~800 bytes (cache-line aligned), and every future that may yield
        // (each connection's, each session's) would keep its room.
        return Box::pin(monoio::time::sleep(Duration::ZERO)).await;
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
    TIMERS_RAN.with(|t| t.set(Some(clock::now())));
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

/// Requests (or session reads) one connection may take in a row before it yields.
pub const TURN: u32 = 8;
