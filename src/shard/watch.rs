//! Followers of lite topics (session pub/sub, Mode 2): at most one subscriber per lite topic,
//! process-wide, woken by the topic's owner after each append.
//!
//! A follower reads the lite topic straight from its owner's log (RocksDB reads are safe from
//! any thread) and sleeps when it has read everything; the owner's fan-out of a lite topic looks
//! the topic up here (one relaxed load while nobody follows anything) and wakes its follower
//! across cores (monoio's wakers are thread-safe with its `sync` feature, as the mailboxes'
//! doorbells are). The registry is a mutex: claims and releases are per subscribe, not per event.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures::task::AtomicWaker;

/// One follower's doorbell.
#[derive(Default)]
pub struct Watch {
    rung: AtomicBool,
    waker: AtomicWaker,
    /// The claim's number, unique in the process (an agent's attachment is told apart from its
    /// next one by it); 0 for a doorbell that is not a claim's.
    pub gen: u64,
    /// Set (and rung) when the follower must end: the topic's home moved to another instance.
    moved: AtomicBool,
}

impl Watch {
    /// Resolves once the owner appended since the last call returned (at once if it did).
    pub async fn rung(&self) {
        std::future::poll_fn(|cx| {
            if self.rung.swap(false, Ordering::AcqRel) {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            if self.rung.swap(false, Ordering::AcqRel) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Whether the follower must end, its topic's home having moved (see [`Watchers::moved`]).
    pub fn has_moved(&self) -> bool {
        self.moved.load(Ordering::Acquire)
    }

    pub(crate) fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// The lite topics being followed (stored names), with their followers' doorbells.
#[derive(Default)]
pub struct Watchers {
    followed: AtomicUsize,
    map: Mutex<HashMap<String, Arc<Watch>>>,
}

/// A lite topic claimed by its one follower; released when dropped.
pub struct Claim {
    watchers: Arc<Watchers>,
    topic: String,
    pub watch: Arc<Watch>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut map = self.watchers.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&self.topic).is_some_and(|w| Arc::ptr_eq(w, &self.watch)) {
            map.remove(&self.topic);
            self.watchers.followed.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Watchers {
    /// Whether `topic` has a follower.
    pub fn is_followed(&self, topic: &str) -> bool {
        self.followed.load(Ordering::SeqCst) > 0
            && self.map.lock().unwrap_or_else(|e| e.into_inner()).contains_key(topic)
    }

    /// The number of `topic`'s follower's claim, if it has one.
    pub fn follower(&self, topic: &str) -> Option<u64> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(topic).map(|w| w.gen)
    }

    /// Makes the caller `topic`'s follower; `None` if it has one.
    pub fn claim(self: &Arc<Self>, topic: &str) -> Option<Claim> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(topic) {
            return None;
        }
        static GEN: AtomicU64 = AtomicU64::new(1);
        let watch = Arc::new(Watch { gen: GEN.fetch_add(1, Ordering::Relaxed), ..Watch::default() });
        map.insert(topic.to_owned(), watch.clone());
        // SeqCst with the fence in `notify`: a follower that then reads the log and finds
        // nothing is sure the owner's later check sees it (else both could miss each other).
        self.followed.fetch_add(1, Ordering::SeqCst);
        Some(Claim { watchers: self.clone(), topic: topic.to_owned(), watch })
    }

    /// `topic`'s home moved to another instance: its follower, if it has one, is woken to
    /// end (WebSocket 1012); whoever follows it next follows it at the new home.
    pub fn moved(&self, topic: &str) {
        if let Some(w) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(topic) {
            w.moved.store(true, Ordering::Release);
            w.ring();
        }
    }

    /// `topic` got events: wakes its follower, if it has one.
    pub fn notify(&self, topic: &str) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.followed.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(w) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(topic) {
            w.ring();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_follower_per_topic_released_on_drop() {
        let w = Arc::new(Watchers::default());
        let first = w.claim(":session.a").expect("free");
        assert!(w.claim(":session.a").is_none());
        assert!(w.is_followed(":session.a") && !w.is_followed(":session.b"));
        drop(first);
        assert!(!w.is_followed(":session.a"));
        assert!(w.claim(":session.a").is_some());
    }

    #[test]
    fn a_moved_home_rings_its_follower_to_end() {
        let w = Arc::new(Watchers::default());
        let c = w.claim(":agent.a").expect("free");
        w.moved(":agent.b");
        assert!(!c.watch.has_moved());
        w.moved(":agent.a");
        assert!(c.watch.has_moved());
        let rung = futures::executor::block_on(futures::future::poll_immediate(c.watch.rung()));
        assert_eq!(rung, Some(()), "woken to see it");
    }
}
