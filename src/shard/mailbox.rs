//! Bounded mailboxes between cores: per ordered (sender, receiver) pair two rings, a *data* lane
//! (appends, deliveries, polls, mirrored records) and a *control* lane (session and interest
//! changes, acks, subscription changes), each with a single producer and a single consumer, plus
//! one wake-up per receiving shard.
//!
//! Built once, before any shard starts, and never resized. A full data ring hands the message
//! back to the sender, which sheds load (503 + Retry-After) instead of blocking or queueing
//! without bound. Control messages must never be lost: a flood of data cannot fill their lane,
//! and a full control ring is retried by the sender (`Shard::send_control`), in order. The
//! receiver drains its control rings before its data rings.
//!
//! [`Mailboxes::ask`] is the one way a request crosses cores, from any sender (a shard, the
//! admin thread, the cluster's appliers): post it (a full ring sheds it or waits, as its
//! [`Overflow`] says), then await its answer within [`CROSS_CORE_DEADLINE`].

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use futures::channel::oneshot;
use futures::task::AtomicWaker;

use super::message::ShardMessage;
use crate::model::ShardId;
use crate::storage::StorageError;

/// How long a request to another core may take before its caller answers 503: longer than any
/// storage wait (fsync, a Kafka ack), short enough that no request hangs.
pub const CROSS_CORE_DEADLINE: Duration = Duration::from_secs(30);

/// What a sender does when the receiver's ring is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Gives up at once: `Unavailable("mailbox full")`, which a client's request answers with
    /// 503 + Retry-After (load is shed, never queued without bound).
    Shed,
    /// Waits for room, never dropping the message: what must not be lost (a mirrored record, a
    /// definition applied from the cluster). A shard never waits: its message queues in its
    /// outbox for the control lane, in order (`Shard::ask`).
    Wait,
}

/// A request for another core and the receiver of its answer, as `ShardMessage`'s
/// constructors make them.
pub type Asked<T> = (ShardMessage, oneshot::Receiver<Result<T, StorageError>>);

/// Awaits a cross-core answer for at most `deadline`: a dropped reply (the message was lost in
/// shutdown) or the deadline is `Unavailable`, which callers answer with 503.
pub async fn answer<T>(rx: oneshot::Receiver<Result<T, StorageError>>, deadline: Duration) -> Result<T, StorageError> {
    match monoio::time::timeout(deadline, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(StorageError::Unavailable("shard stopped")),
        Err(_) => Err(StorageError::Unavailable("no answer from the owning shard in time")),
    }
}

/// The pause between tries of a sender waiting for room (`Overflow::Wait`), at most.
const ROOM_WAIT: Duration = Duration::from_millis(1);

/// Who is sending: a shard, or the admin thread (which sends but never receives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    Shard(ShardId),
    Admin,
}

struct Doorbell {
    rung: AtomicBool,
    waker: AtomicWaker,
}

/// The least room of a control ring: session changes come in bursts (a reconnect storm), and
/// each one that does not fit waits in the sender's outbox.
pub const CONTROL_CAPACITY: usize = 256;

pub struct Mailboxes {
    shards: usize,
    /// `rings[from * shards + to]`; `from == shards` is the admin thread.
    rings: Box<[CachePadded<ArrayQueue<ShardMessage>>]>,
    /// The control lane, laid out like `rings`.
    control: Box<[CachePadded<ArrayQueue<ShardMessage>>]>,
    bells: Box<[CachePadded<Doorbell>]>,
}

impl Mailboxes {
    /// `capacity` messages per data ring, at least [`CONTROL_CAPACITY`] per control ring; memory
    /// is `(shards + 1) * shards * (capacity + control capacity) * 64` bytes.
    pub fn new(shards: usize, capacity: usize) -> Self {
        let lane = |n: usize| (0..(shards + 1) * shards).map(|_| CachePadded::new(ArrayQueue::new(n))).collect();
        let (rings, control) = (lane(capacity), lane(capacity.max(CONTROL_CAPACITY)));
        let bells = (0..shards)
            .map(|_| CachePadded::new(Doorbell { rung: AtomicBool::new(false), waker: AtomicWaker::new() }))
            .collect();
        Mailboxes { shards, rings, control, bells }
    }

    fn row(&self, from: Sender) -> usize {
        match from {
            Sender::Shard(s) => s.index(),
            Sender::Admin => self.shards,
        }
    }

    /// Queues `msg` for `to` on the data lane and rings its doorbell; a full ring gives the
    /// message back.
    pub fn send(&self, from: Sender, to: ShardId, msg: ShardMessage) -> Result<(), ShardMessage> {
        self.rings[self.row(from) * self.shards + to.index()].push(msg)?;
        self.ring(to);
        Ok(())
    }

    /// Queues `msg` for `to` on the control lane; a full ring gives it back (the caller retries:
    /// control messages are never dropped).
    pub fn send_control(&self, from: Sender, to: ShardId, msg: ShardMessage) -> Result<(), ShardMessage> {
        self.control[self.row(from) * self.shards + to.index()].push(msg)?;
        self.ring(to);
        Ok(())
    }

    /// Posts `msg` to `to` on the data lane from a monoio runtime (a shard, the admin thread,
    /// the cluster's appliers); a full ring is met as `overflow` says.
    pub async fn post(
        &self,
        from: Sender,
        to: ShardId,
        mut msg: ShardMessage,
        overflow: Overflow,
    ) -> Result<(), StorageError> {
        let mut wait = Duration::from_micros(20);
        loop {
            match self.send(from, to, msg) {
                Ok(()) => return Ok(()),
                Err(_) if overflow == Overflow::Shed => return Err(StorageError::Unavailable("mailbox full")),
                Err(back) => msg = back,
            }
            monoio::time::sleep(wait).await;
            wait = (wait * 2).min(ROOM_WAIT);
        }
    }

    /// [`Mailboxes::post`] with [`Overflow::Wait`] from a thread with no runtime (the Kafka
    /// tail's callback): it sleeps between tries.
    pub fn post_from_thread(&self, to: ShardId, mut msg: ShardMessage) {
        while let Err(back) = self.send(Sender::Admin, to, msg) {
            msg = back;
            std::thread::sleep(ROOM_WAIT);
        }
    }

    /// The one way a request crosses cores: posts it (as `overflow` says), then awaits its
    /// answer within [`CROSS_CORE_DEADLINE`].
    pub async fn ask<T>(
        &self,
        from: Sender,
        to: ShardId,
        asked: Asked<T>,
        overflow: Overflow,
    ) -> Result<T, StorageError> {
        self.ask_within(from, to, asked, overflow, CROSS_CORE_DEADLINE).await
    }

    /// [`Mailboxes::ask`] with a deadline of the caller's (a long poll's wait and then some).
    pub async fn ask_within<T>(
        &self,
        from: Sender,
        to: ShardId,
        (msg, rx): Asked<T>,
        overflow: Overflow,
        deadline: Duration,
    ) -> Result<T, StorageError> {
        self.post(from, to, msg, overflow).await?;
        answer(rx, deadline).await
    }

    fn ring(&self, to: ShardId) {
        let bell = &self.bells[to.index()];
        bell.rung.store(true, Ordering::Release);
        bell.waker.wake();
    }

    /// Messages waiting for `to`, over all its rings of both lanes (a gauge; racy by nature).
    pub fn depth(&self, to: ShardId) -> usize {
        (0..=self.shards)
            .map(|from| {
                self.rings[from * self.shards + to.index()].len() + self.control[from * self.shards + to.index()].len()
            })
            .sum()
    }

    /// Hands every queued message for `me` to `f`, control lane first; returns how many there
    /// were.
    pub fn drain(&self, me: ShardId, mut f: impl FnMut(ShardMessage)) -> usize {
        let mut n = 0;
        for lane in [&self.control, &self.rings] {
            for from in 0..=self.shards {
                let ring = &lane[from * self.shards + me.index()];
                while let Some(m) = ring.pop() {
                    f(m);
                    n += 1;
                }
            }
        }
        n
    }

    /// Resolves once the doorbell of `me` has rung since the last wait.
    pub async fn wait(&self, me: ShardId) {
        let bell = &self.bells[me.index()];
        poll_fn(|cx| {
            if bell.rung.swap(false, Ordering::Acquire) {
                return Poll::Ready(());
            }
            bell.waker.register(cx.waker());
            if bell.rung.swap(false, Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PartitionId;

    #[test]
    fn full_ring_hands_the_message_back() {
        let m = Mailboxes::new(2, 1);
        let (a, _rx) = ShardMessage::append(PartitionId(0), Vec::new());
        let (b, _rx2) = ShardMessage::append(PartitionId(1), Vec::new());
        assert!(m.send(Sender::Shard(ShardId(0)), ShardId(1), a).is_ok());
        let back = m.send(Sender::Shard(ShardId(0)), ShardId(1), b).unwrap_err();
        assert!(matches!(back, ShardMessage::Append { partition: PartitionId(1), .. }));
        // Another sender's ring to the same shard is independent.
        let (c, _rx3) = ShardMessage::append(PartitionId(2), Vec::new());
        assert!(m.send(Sender::Admin, ShardId(1), c).is_ok());
        assert_eq!(m.depth(ShardId(1)), 2);
        assert_eq!(m.drain(ShardId(1), drop), 2);
        assert_eq!(m.depth(ShardId(1)), 0);
        assert_eq!(m.drain(ShardId(0), drop), 0);
    }

    #[test]
    fn a_full_data_lane_leaves_the_control_lane_free_and_control_drains_first() {
        let m = Mailboxes::new(2, 1);
        let control = |n: u64| ShardMessage::subscription(crate::shard::message::SubRequest::Remove(n.to_string())).0;
        let from = Sender::Shard(ShardId(0));
        let (a, _rx) = ShardMessage::append(PartitionId(0), Vec::new());
        assert!(m.send(from, ShardId(1), a).is_ok());
        let (b, _rx2) = ShardMessage::append(PartitionId(1), Vec::new());
        assert!(m.send(from, ShardId(1), b).is_err(), "data lane full");
        let (c, _rx3) = ShardMessage::subscription(crate::shard::message::SubRequest::Remove("s".into()));
        assert!(m.send_control(from, ShardId(1), c).is_ok(), "control lane has its own room");
        let mut order = Vec::new();
        m.drain(ShardId(1), |msg| order.push(matches!(msg, ShardMessage::Subscription { .. })));
        assert_eq!(order, [true, false], "control first");
        // A control ring has its own, larger room; a full one hands the message back too.
        for n in 0..CONTROL_CAPACITY as u64 {
            assert!(m.send_control(from, ShardId(1), control(n)).is_ok(), "{n}");
        }
        assert!(m.send_control(from, ShardId(1), control(0)).is_err());
    }
}
