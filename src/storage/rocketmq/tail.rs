//! The tail thread (`evmesh-rocketmq-tail`): pulls every followed queue from the end of its
//! local copy, all at once, and hands what it brings to the partition's owner, in offset order.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::client::Pulled;
use super::{Ask, Job};
use crate::model::PartitionId;
use crate::storage::remote::{Deliver, Follow};
use crate::storage::StorageError;

/// How long the tail rests after a round that brought nothing.
const IDLE: Duration = Duration::from_millis(10);

/// The longest a partition whose pulls fail (its broker away) waits before the next one.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A followed partition, and when it may be pulled again after failures.
struct Followed {
    f: Follow,
    failures: u32,
    retry_at: Instant,
}

/// The tail: every followed partition (evmesh topic, partition, next offset), pulled round after
/// round; one whose pulls fail waits 10 ms, then twice as long each time, up to a second.
pub(super) fn tail(jobs: tokio::sync::mpsc::UnboundedSender<Job>, follow: mpsc::Receiver<Follow>, deliver: Deliver) {
    let mut followed: Vec<Followed> = Vec::new();
    let mut warned = Instant::now() - Duration::from_secs(60);
    loop {
        for f in std::iter::from_fn(|| follow.try_recv().ok()) {
            // Asked again (two shards made its topic at once): followed once, from where it is.
            if !followed.iter().any(|g| g.f.topic == f.topic && g.f.partition == f.partition) {
                followed.push(Followed { f, failures: 0, retry_at: Instant::now() });
            }
        }
        let mut brought = false;
        let now = Instant::now();
        // Every due queue's pull is out at once; their answers are taken in turn.
        let mut pulls = Vec::with_capacity(followed.len());
        for g in followed.iter().filter(|g| g.retry_at <= now) {
            let (reply, rx) = futures::channel::oneshot::channel();
            let job = Job::Ask(Ask::Pull { topic: g.f.topic.clone(), partition: g.f.partition, from: g.f.from, reply });
            if jobs.send(job).is_err() {
                return; // the client thread stopped: the process is going
            }
            pulls.push(rx);
        }
        for (g, rx) in followed.iter_mut().filter(|g| g.retry_at <= now).zip(pulls) {
            let f = &mut g.f;
            let pulled: Result<Pulled, StorageError> =
                futures::executor::block_on(rx).unwrap_or(Err(StorageError::Unavailable("rocketmq client stopped")));
            match pulled {
                Ok(p) => {
                    g.failures = 0;
                    if p.moved {
                        crate::log::warn(
                            "storage",
                            &format!(
                                "rocketmq tail: {}/{}: offsets {}..{} are not in the queue any more",
                                f.topic, f.partition, f.from, p.next
                            ),
                            &[],
                        );
                    }
                    brought |= p.next > f.from;
                    f.from = p.next;
                    if !p.frames.is_empty() {
                        deliver((PartitionId(f.partition), p.frames));
                    }
                }
                // Broker away, topic not routed yet: tried again after a while, said now and then.
                Err(e) => {
                    g.failures = g.failures.saturating_add(1);
                    g.retry_at = Instant::now() + (IDLE * 2u32.saturating_pow(g.failures.min(10))).min(BACKOFF_MAX);
                    if warned.elapsed() > Duration::from_secs(10) {
                        crate::log::warn("storage", &format!("rocketmq tail: {}/{}: {e}", f.topic, f.partition), &[]);
                        warned = Instant::now();
                    }
                }
            }
        }
        if !brought {
            std::thread::sleep(IDLE);
        }
    }
}
