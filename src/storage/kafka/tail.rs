//! The tail thread (`evmesh-kafka-tail`): reads every followed partition from the end of its
//! local copy and hands batches to their owners, in offset order (gaps read again first).

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use frame_codec::Frame;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::model::PartitionId;
use crate::storage::remote::{Fetched, Follow};

/// The tail thread: reads every followed partition and hands batches to their owners.
pub(super) fn tail(consumer: BaseConsumer, follow: mpsc::Receiver<Follow>, prefix: &str, deliver: impl Fn(Fetched)) {
    let mut batch: Vec<(String, PartitionId, Vec<Frame>)> = Vec::new();
    let mut logged = std::time::Instant::now() - Duration::from_secs(60);
    let mut followed = Followed::default();
    let (mut retry, mut failed): (Vec<Follow>, u32) = (Vec::new(), 0);
    loop {
        let (mut added, mut new) = (TopicPartitionList::new(), Vec::new());
        for f in std::mem::take(&mut retry).into_iter().chain(std::iter::from_fn(|| follow.try_recv().ok())) {
            if followed.first(&f) {
                let _ = added.add_partition_offset(&f.topic, f.partition as i32, Offset::Offset(f.from as i64));
                new.push(f);
            }
        }
        let now = std::time::Instant::now();
        if added.count() > 0 {
            match consumer.incremental_assign(&added) {
                Ok(()) => failed = 0,
                Err(e) => {
                    // Not followed yet: asked for again on the next turns (20 ms apart) until it
                    // is (whoever asked counts on it: it is never asked for again), said now
                    // and then.
                    failed += 1;
                    if failed % 500 == 1 {
                        crate::log::warn("storage", &format!("kafka tail: assign: {e}; trying again"), &[]);
                    }
                    for f in new {
                        followed.forget(&f);
                        retry.push(f);
                    }
                }
            }
        }
        let mut fetched = 0;
        while fetched < 1024 {
            match consumer.poll(Duration::from_millis(if fetched == 0 { 20 } else { 0 })) {
                Some(Ok(m)) => {
                    fetched += 1;
                    let (p, o) = (m.partition() as u32, m.offset() as u64);
                    match followed.fetched(m.topic(), p, o, now) {
                        Gap::None => {}
                        // Past a gap being checked: fetched again after the missing offsets.
                        Gap::Drop => continue,
                        Gap::Recheck(from) => {
                            let at = Offset::Offset(from as i64);
                            if let Err(e) = consumer.seek(m.topic(), p as i32, at, Duration::ZERO) {
                                crate::log::warn(
                                    "storage",
                                    &format!("kafka tail: {}/{p}: reading again from {from}: {e}", m.topic()),
                                    &[],
                                );
                            }
                            continue;
                        }
                    }
                    let headers: Vec<(&str, &[u8])> = m
                        .headers()
                        .map(|h| h.iter().map(|h| (h.key, h.value.unwrap_or(&[]))).collect())
                        .unwrap_or_default();
                    let ts = m.timestamp().to_millis().unwrap_or(0);
                    // Only followed topics arrive, and those all carry the prefix.
                    let Some(topic) = m.topic().strip_prefix(prefix) else { continue };
                    let value = m.payload().unwrap_or(&[]);
                    match crate::adaptor::kafka::from_record(topic, p, o, m.key(), &headers, value, ts) {
                        Ok(f) => match batch.iter_mut().find(|b| b.0 == topic && b.1 .0 == p) {
                            Some(b) => b.2.push(f),
                            None => batch.push((topic.to_owned(), PartitionId(p), vec![f])),
                        },
                        Err(e) => {
                            crate::log::warn("storage", &format!("kafka tail: {}/{p}@{o} skipped: {e}", m.topic()), &[])
                        }
                    }
                }
                Some(Err(e)) => {
                    // Broker away: librdkafka reconnects by itself; say so now and then, and do
                    // not spin on the errors meanwhile.
                    if logged.elapsed() > Duration::from_secs(10) {
                        crate::log::warn("storage", &format!("kafka tail: {e}"), &[]);
                        logged = std::time::Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
                None => break,
            }
        }
        for (_, p, frames) in batch.drain(..) {
            deliver((p, frames));
        }
    }
}

/// The partitions the tail follows, and the next offset expected of each.
///
/// A partition asked for again (two shards made its topic at once, or a definition from
/// another instance named it too) is followed already: assigning it again would fail the whole
/// assignment it is in (librdkafka: `_INVALID_ARG`), new partitions with it.
///
/// A fetch that skips offsets is read again from the first missing one for up to
/// [`GAP_RECHECK`] before the gap is taken as the log's own (compaction, transaction markers):
/// a broker may answer a fetch with records past ones it has assigned offsets to and not yet
/// made readable (seen with tansu under concurrent producers), and the local copy, which
/// delivery reads, must not skip what Kafka holds.
#[derive(Default)]
struct Followed(HashMap<String, HashMap<u32, Expected>>);

#[derive(Clone, Copy)]
struct Expected {
    next: u64,
    /// When records past `next` were first fetched (a gap being checked), and when the
    /// partition was last read again from `next`.
    gap_since: Option<(std::time::Instant, std::time::Instant)>,
}

/// How often a gap being checked is read again.
const GAP_RESEEK: Duration = Duration::from_millis(20);

/// How long a fetched gap is read again before it is taken as the log's.
const GAP_RECHECK: Duration = Duration::from_millis(500);

/// What to do with a fetched record.
#[derive(Debug, PartialEq, Eq)]
enum Gap {
    /// Take it.
    None,
    /// Drop it: the partition is being read again from before it.
    Drop,
    /// Drop it and read the partition again from this offset.
    Recheck(u64),
}

impl Followed {
    /// Whether `f` is a partition not followed yet (now it is, from `f.from`).
    fn first(&mut self, f: &Follow) -> bool {
        match self.0.entry(f.topic.clone()).or_default().entry(f.partition) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Expected { next: f.from, gap_since: None });
                true
            }
        }
    }

    /// `f`'s partition is not followed after all (its assignment failed).
    fn forget(&mut self, f: &Follow) {
        if let Some(t) = self.0.get_mut(&f.topic) {
            t.remove(&f.partition);
        }
    }

    /// A record at `offset` of `topic`/`partition` was fetched at `now`.
    fn fetched(&mut self, topic: &str, partition: u32, offset: u64, now: std::time::Instant) -> Gap {
        // (By the name borrowed: no allocation per record.)
        let Some(e) = self.0.get_mut(topic).and_then(|t| t.get_mut(&partition)) else { return Gap::None };
        if offset < e.next {
            return Gap::None; // read again after a recheck, or the owner skips it as stored
        }
        if offset > e.next {
            let Some((since, sought)) = e.gap_since else {
                e.gap_since = Some((now, now));
                return Gap::Recheck(e.next);
            };
            if now.saturating_duration_since(since) < GAP_RECHECK {
                if now.saturating_duration_since(sought) < GAP_RESEEK {
                    return Gap::Drop;
                }
                e.gap_since = Some((since, now));
                return Gap::Recheck(e.next);
            }
            crate::log::warn(
                "storage",
                &format!("kafka tail: {topic}/{partition}: offsets {}..{offset} are not in the log", e.next),
                &[],
            );
        }
        *e = Expected { next: offset + 1, gap_since: None };
        Gap::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_that_skips_offsets_is_read_again_before_the_gap_is_taken() {
        let mut followed = Followed::default();
        let t0 = std::time::Instant::now();
        assert!(followed.first(&Follow { topic: "t".into(), partition: 0, from: 5 }));
        assert_eq!(followed.fetched("t", 0, 5, t0), Gap::None);
        // 6 and 7 skipped: read again from 6 while the gap is young.
        assert_eq!(followed.fetched("t", 0, 8, t0), Gap::Recheck(6));
        assert_eq!(followed.fetched("t", 0, 9, t0), Gap::Drop, "read again already");
        assert_eq!(followed.fetched("t", 0, 8, t0 + GAP_RESEEK), Gap::Recheck(6), "and again");
        // They came: taken in order.
        assert_eq!(followed.fetched("t", 0, 6, t0 + GAP_RECHECK / 2), Gap::None);
        assert_eq!(followed.fetched("t", 0, 7, t0 + GAP_RECHECK / 2), Gap::None);
        assert_eq!(followed.fetched("t", 0, 8, t0 + GAP_RECHECK / 2), Gap::None);
        // A gap that stays is the log's own once checked for long enough.
        assert_eq!(followed.fetched("t", 0, 12, t0), Gap::Recheck(9));
        assert_eq!(followed.fetched("t", 0, 12, t0 + GAP_RECHECK), Gap::None, "taken as the log's");
        assert_eq!(followed.fetched("t", 0, 13, t0 + GAP_RECHECK), Gap::None);
        // Records before the next expected (read again) are handed on; unknown partitions too.
        assert_eq!(followed.fetched("t", 0, 10, t0), Gap::None);
        assert_eq!(followed.fetched("u", 0, 99, t0), Gap::None);
    }

    #[test]
    fn a_partition_is_followed_once_whoever_asks_again() {
        let mut followed = Followed::default();
        let f = |topic: &str, partition, from| Follow { topic: topic.into(), partition, from };
        assert!(followed.first(&f("t", 0, 0)));
        assert!(followed.first(&f("t", 1, 0)));
        assert!(!followed.first(&f("t", 0, 7)), "followed already, from wherever");
        assert!(followed.first(&f("u", 0, 0)));
    }
}
