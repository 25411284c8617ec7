//! Cooperative scheduling helpers for the shards' monoio event loops.

use std::cell::RefCell;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

thread_local! {
    /// This thread's heartbeat (ms since the epoch given), if it is a shard's.
    static BEAT: RefCell<Option<(Arc<AtomicU64>, Instant)>> = const { RefCell::new(None) };
}

/// Makes this thread's turns stamp `beat` with the milliseconds since `epoch`: a busy loop that
/// yields is a core that turns, even while timers (the periodic heartbeat) wait behind it.
pub fn set_heartbeat(beat: Arc<AtomicU64>, epoch: Instant) {
    BEAT.with(|b| *b.borrow_mut() = Some((beat, epoch)));
}

/// Stamps this thread's heartbeat, if it has one.
pub fn beat() {
    BEAT.with(|b| {
        if let Some((beat, epoch)) = &*b.borrow() {
            beat.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    });
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
pub async fn yield_now() {
    beat();
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

/// Requests (or session reads) one connection may take in a row before it yields.
pub const TURN: u32 = 8;

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
}
