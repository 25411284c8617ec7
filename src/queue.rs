//! A bounded queue between tasks of one shard thread: what a session's writer drains.
//!
//! The same contract as `futures::channel::mpsc`'s bounded channel, which it replaces on the
//! delivery path: room for `bound` items plus one per sender, `try_send` fails when full or when
//! the receiver is gone, `close_channel` lets the receiver take what is queued and then see the
//! end, and the receiver sees the end once every sender is dropped. Without the thread-safe
//! parts: no atomics, no spin on pop, one `RefCell` borrow per operation. A fan-out queues each
//! event to every session of a topic, so this is paid once per delivery.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// 72 bytes: every session holds one (its events), so the rarely used parts are small.
struct Chan<T> {
    items: VecDeque<T>,
    bound: u32,
    senders: u32,
    /// `close_channel` was called or the receiver is gone: nothing more is accepted.
    closed: bool,
    receiver: Option<Waker>,
    /// The receiver is waiting: the next item wakes it (and only that one, as futures' does).
    parked: bool,
    /// Senders waiting in [`Sender::send`] for room (boxed: most queues never have one, and
    /// every session's queue would hold an empty `Vec`'s 24 bytes).
    #[allow(clippy::box_collection)]
    waiting: Option<Box<Vec<Waker>>>,
}

impl<T> Chan<T> {
    fn full(&self) -> bool {
        self.items.len() >= self.bound as usize + self.senders as usize
    }

    /// Wakes a waiting receiver once. The waker is kept, not taken: the receiver's next wait
    /// finds it in place and clones nothing.
    fn wake_receiver(&mut self) {
        if std::mem::take(&mut self.parked) {
            if let Some(w) = &self.receiver {
                w.wake_by_ref();
            }
        }
    }
}

/// Why [`Sender::try_send`] did not queue the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrySendError {
    Full,
    Closed,
}

/// Why [`Receiver::try_recv`] returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing queued now; more may come.
    Empty,
    /// Nothing queued and nothing more will come.
    Closed,
}

impl TryRecvError {
    pub fn is_closed(self) -> bool {
        self == TryRecvError::Closed
    }
}

pub struct Sender<T> {
    chan: Rc<RefCell<Chan<T>>>,
}

pub struct Receiver<T> {
    chan: Rc<RefCell<Chan<T>>>,
}

/// A queue holding up to `bound` items plus one per sender.
pub fn channel<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
    let chan = Rc::new(RefCell::new(Chan {
        items: VecDeque::new(),
        bound: u32::try_from(bound).unwrap_or(u32::MAX),
        senders: 1,
        closed: false,
        receiver: None,
        parked: false,
        waiting: None,
    }));
    (Sender { chan: chan.clone() }, Receiver { chan })
}

impl<T> Sender<T> {
    /// Queues `item` now, or says why not (the item is dropped).
    pub fn try_send(&self, item: T) -> Result<(), TrySendError> {
        let mut c = self.chan.borrow_mut();
        if c.closed {
            return Err(TrySendError::Closed);
        }
        if c.full() {
            return Err(TrySendError::Full);
        }
        c.items.push_back(item);
        c.wake_receiver();
        Ok(())
    }

    /// Queues `item` even past the bound (refused only once the queue is closed): for the one
    /// close a sender may ask for, which a queue full of other items must not lose.
    pub fn send_past_bound(&self, item: T) -> Result<(), TrySendError> {
        let mut c = self.chan.borrow_mut();
        if c.closed {
            return Err(TrySendError::Closed);
        }
        c.items.push_back(item);
        c.wake_receiver();
        Ok(())
    }

    /// Queues `item` once there is room; `Err` with the item if the queue closed first.
    pub async fn send(&mut self, item: T) -> Result<(), T> {
        let mut item = Some(item);
        poll_fn(|cx| {
            let mut c = self.chan.borrow_mut();
            if c.closed {
                return Poll::Ready(Err(item.take().expect("polled after ready")));
            }
            if c.full() {
                let waiting = c.waiting.get_or_insert_default();
                if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    waiting.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
            c.items.push_back(item.take().expect("polled after ready"));
            c.wake_receiver();
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// Accepts nothing more; the receiver still gets what is queued, then the end.
    pub fn close_channel(&self) {
        let mut c = self.chan.borrow_mut();
        c.closed = true;
        c.wake_receiver();
        for w in c.waiting.take().into_iter().flat_map(|w| *w) {
            w.wake();
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.chan.borrow_mut().senders += 1;
        Sender { chan: self.chan.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut c = self.chan.borrow_mut();
        c.senders -= 1;
        if c.senders == 0 {
            c.wake_receiver();
        }
    }
}

impl<T> Receiver<T> {
    /// The next item, or `None` once the queue is closed or every sender is gone and it is
    /// empty.
    pub fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Unpin + '_ {
        poll_fn(|cx| match self.try_recv() {
            Ok(item) => Poll::Ready(Some(item)),
            Err(TryRecvError::Closed) => Poll::Ready(None),
            Err(TryRecvError::Empty) => {
                let mut c = self.chan.borrow_mut();
                if !c.receiver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    c.receiver = Some(cx.waker().clone());
                }
                c.parked = true;
                Poll::Pending
            }
        })
    }

    /// Gives back the room an empty queue grew to (an idle session's).
    pub fn shrink_idle(&mut self) {
        let mut c = self.chan.borrow_mut();
        if c.items.is_empty() && c.items.capacity() > 0 {
            c.items = VecDeque::new();
        }
    }

    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut c = self.chan.borrow_mut();
        match c.items.pop_front() {
            Some(item) => {
                if let Some(w) = c.waiting.as_mut().and_then(|w| w.pop()) {
                    w.wake();
                }
                Ok(item)
            }
            None if c.closed || c.senders == 0 => Err(TryRecvError::Closed),
            None => Err(TryRecvError::Empty),
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut c = self.chan.borrow_mut();
        c.closed = true;
        c.receiver = None;
        // Whatever is queued is of no use now; drop it (and what it pins) at once.
        c.items.clear();
        for w in c.waiting.take().into_iter().flat_map(|w| *w) {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().build().expect("runtime").block_on(f)
    }

    #[test]
    fn holds_bound_plus_one_per_sender() {
        let (tx, mut rx) = channel::<u32>(2);
        let tx2 = tx.clone();
        for i in 0..4 {
            assert_eq!(tx.try_send(i), Ok(()));
        }
        assert_eq!(tx2.try_send(9), Err(TrySendError::Full));
        assert_eq!(rx.try_recv(), Ok(0));
        assert_eq!(tx2.try_send(4), Ok(()));
        let got: Vec<u32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got, [1, 2, 3, 4]);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn a_close_goes_past_the_bound_but_not_past_the_end() {
        let (tx, mut rx) = channel::<u32>(0);
        tx.try_send(1).unwrap();
        assert_eq!(tx.try_send(2), Err(TrySendError::Full));
        assert_eq!(tx.send_past_bound(99), Ok(()));
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.try_recv(), Ok(99));
        tx.close_channel();
        assert_eq!(tx.send_past_bound(100), Err(TrySendError::Closed));
    }

    /// The receiver is woken once per wait, not once per item (a busy writer is not re-polled
    /// for every delivery).
    #[test]
    fn a_waiting_receiver_is_woken_once() {
        use std::future::Future;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let (tx, mut rx) = channel::<u32>(8);
        assert!(std::pin::pin!(rx.recv()).poll(&mut cx).is_pending());
        for i in 0..5 {
            tx.try_send(i).unwrap();
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // Not waiting: items queue without waking anything.
        assert_eq!(rx.try_recv(), Ok(0));
        tx.try_send(5).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn close_delivers_what_is_queued_then_the_end() {
        let (tx, mut rx) = channel::<u32>(4);
        tx.try_send(1).unwrap();
        tx.close_channel();
        assert_eq!(tx.try_send(2), Err(TrySendError::Closed));
        block_on(async {
            assert_eq!(rx.recv().await, Some(1));
            assert_eq!(rx.recv().await, None);
        });
    }

    #[test]
    fn the_end_comes_when_every_sender_is_dropped() {
        let (tx, mut rx) = channel::<u32>(4);
        let tx2 = tx.clone();
        block_on(async move {
            let reader = monoio::spawn(async move { rx.recv().await });
            crate::task::yield_now().await;
            drop(tx);
            crate::task::yield_now().await;
            drop(tx2);
            assert_eq!(reader.await, None);
        });
    }

    #[test]
    fn a_dropped_receiver_refuses_more_and_frees_a_waiting_sender() {
        let (mut tx, rx) = channel::<u32>(0);
        tx.try_send(1).unwrap();
        block_on(async move {
            let blocked = monoio::spawn(async move { tx.send(2).await });
            crate::task::yield_now().await;
            drop(rx);
            assert_eq!(blocked.await, Err(2));
        });
    }

    #[test]
    fn a_waiting_sender_gets_room_when_the_receiver_takes() {
        let (mut tx, mut rx) = channel::<u32>(0);
        tx.try_send(1).unwrap();
        block_on(async move {
            let blocked = monoio::spawn(async move { tx.send(2).await });
            crate::task::yield_now().await;
            assert_eq!(rx.try_recv(), Ok(1));
            assert_eq!(blocked.await, Ok(()));
            assert_eq!(rx.recv().await, Some(2));
        });
    }
}
