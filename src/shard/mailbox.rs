//! Bounded mailboxes between cores: one ring per ordered (sender, receiver) pair, so each ring has
//! a single producer and a single consumer, plus one wake-up per receiving shard.
//!
//! Built once, before any shard starts, and never resized. A full ring hands the message back to
//! the sender, which sheds load (503 + Retry-After) instead of blocking or queueing without bound.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use futures::task::AtomicWaker;

use super::message::ShardMessage;
use super::ShardId;

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

pub struct Mailboxes {
    shards: usize,
    /// `rings[from * shards + to]`; `from == shards` is the admin thread.
    rings: Box<[CachePadded<ArrayQueue<ShardMessage>>]>,
    bells: Box<[CachePadded<Doorbell>]>,
}

impl Mailboxes {
    /// `capacity` messages per ring; memory is `(shards + 1) * shards * capacity * 64` bytes.
    pub fn new(shards: usize, capacity: usize) -> Self {
        let rings = (0..(shards + 1) * shards).map(|_| CachePadded::new(ArrayQueue::new(capacity))).collect();
        let bells = (0..shards)
            .map(|_| CachePadded::new(Doorbell { rung: AtomicBool::new(false), waker: AtomicWaker::new() }))
            .collect();
        Mailboxes { shards, rings, bells }
    }

    fn row(&self, from: Sender) -> usize {
        match from {
            Sender::Shard(s) => s.index(),
            Sender::Admin => self.shards,
        }
    }

    /// Queues `msg` for `to` and rings its doorbell; a full ring gives the message back.
    pub fn send(&self, from: Sender, to: ShardId, msg: ShardMessage) -> Result<(), ShardMessage> {
        self.rings[self.row(from) * self.shards + to.index()].push(msg)?;
        let bell = &self.bells[to.index()];
        bell.rung.store(true, Ordering::Release);
        bell.waker.wake();
        Ok(())
    }

    /// Messages waiting for `to`, over all its rings (a gauge; racy by nature).
    pub fn depth(&self, to: ShardId) -> usize {
        (0..=self.shards).map(|from| self.rings[from * self.shards + to.index()].len()).sum()
    }

    /// Hands every queued message for `me` to `f`; returns how many there were.
    pub fn drain(&self, me: ShardId, mut f: impl FnMut(ShardMessage)) -> usize {
        let mut n = 0;
        for from in 0..=self.shards {
            let ring = &self.rings[from * self.shards + me.index()];
            while let Some(m) = ring.pop() {
                f(m);
                n += 1;
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
    use crate::shard::PartitionId;

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
}
