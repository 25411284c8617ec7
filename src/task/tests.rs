//! The cooperative scheduling's tests: yields, the heavy lane and the gate, on monoio runtimes.

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

/// Inside a metered poll the thread's recent reading is never older than the poll: the poll
/// marks it stale and the first question reads the clock (a reading from before the poll
/// would date an event, or start a deadline, as early as the loop's last sleep).
#[test]
fn a_metered_poll_never_answers_with_a_reading_from_before_it() {
    let earlier = super::clock::now();
    let before = loop {
        let t = std::time::Instant::now();
        if t > earlier {
            break t;
        }
    };
    let meter = super::Meter::default();
    let (first, second) =
        runtime().block_on(super::metered(&meter, async { (super::clock::recent(), super::clock::recent()) }));
    assert!(first >= before, "a metered poll answered with the reading from before it");
    assert_eq!(first, second, "the poll's second question read the clock again");
}

/// A meter's ticks come out as the time they took: a poll that spins 20 ms is metered within
/// a quarter of that by the monotonic clock.
#[test]
fn a_meter_counts_the_time_a_poll_takes() {
    let meter = super::Meter::default();
    let took = runtime().block_on(super::metered(&meter, async {
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        t.elapsed()
    }));
    let metered = meter.take();
    let (lo, hi) = (took.mul_f64(0.75), took.mul_f64(1.25) + std::time::Duration::from_millis(1));
    assert!(metered >= lo && metered <= hi, "metered {metered:?} for a poll of {took:?}");
    assert_eq!(meter.take(), std::time::Duration::ZERO, "a meter's time is taken once");
}

/// A request handled in a metered poll ends with the meter's `take`: the next request in the
/// same poll reads the clock again rather than answering with the first one's reading.
#[test]
fn each_request_in_a_poll_reads_the_clock_afresh() {
    let meter = super::Meter::default();
    let (first, second) = runtime().block_on(super::metered(&meter, async {
        let first = super::clock::recent();
        meter.take();
        while std::time::Instant::now() <= first {
            std::hint::spin_loop();
        }
        (first, super::clock::recent())
    }));
    assert!(second > first, "the second request answered with the first one's reading");
}

/// Spins in a metered poll for three windows of the load measure, as requests that each end
/// with the meter's `take` (a connection's): the loop looks busy.
pub(crate) async fn busy_windows() {
    let d = super::load::WINDOW * 3;
    let meter = super::Meter::default();
    super::metered(&meter, async {
        let t = std::time::Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
            meter.take();
        }
    })
    .await
}

/// Lets a whole window of the load measure pass with nothing metered in it.
pub(crate) fn idle_window() {
    super::has_time();
    std::thread::sleep(super::load::WINDOW * 2);
}

/// The core has time after a window with little metered work in it, and not after one its
/// metered polls filled; a window is judged whole, when asked after it ended.
#[test]
fn the_core_has_time_unless_the_last_window_was_busy() {
    runtime().block_on(async {
        idle_window();
        assert!(super::has_time(), "an idle window");
        busy_windows().await;
        assert!(!super::has_time(), "a window the metered polls filled");
        assert!(!super::has_time(), "still, until the next window ends");
        idle_window();
        assert!(super::has_time(), "an idle window again");
    });
}
