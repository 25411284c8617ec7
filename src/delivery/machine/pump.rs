//! Sending a consumer's partition what its holder has room for ([`Machine::pump`]): due
//! redeliveries first (sticky order), then new events, from an append's frames or read from
//! the log, within the session's and the partition's windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use frame_codec::Frame;

use super::consumers::Machine;
use super::effect::{now_ms, persist, Effect, ACK_TIMEOUT};
use super::source::{expired, request_deadline, Source};
use super::state::{Consumer, Retry, Sess};
use crate::model::delivery::ConsumerKey;
use crate::subscription::filter::matches_all;

/// Unacknowledged events per consumer and partition, whatever the windows say.
const PART_INFLIGHT: usize = 4096;
/// Events read from the log at once when catching up.
const READ_BATCH: usize = 256;
/// Events one pump of a partition may read (a selective filter can skip many per delivery);
/// past it the pump asks to continue later ([`Effect::Continue`]).
const SCAN_BUDGET: usize = 4096;

impl Machine {
    /// Newly stored events of a partition this shard owns: every consumer of the topic gets
    /// them, straight from `frames` when it is caught up (no log read).
    pub fn appended(
        &mut self,
        topic: &str,
        frames: &Arc<[Frame]>,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let Some(p) = frames.first().map(|f| f.header().partition) else { return };
        for k in self.consumers_of(topic) {
            self.pump(&k, p, Some(frames), now, src, out);
        }
    }

    /// Sends a consumer's partition what its holder has room for: due redeliveries first, then
    /// new events (from `fresh` when it continues exactly where the consumer is, else the log).
    pub fn pump(
        &mut self,
        key: &ConsumerKey,
        p: u32,
        fresh: Option<&Arc<[Frame]>>,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) {
        let window_bytes = self.window_bytes;
        let Some(rc) = self.rc(key) else { return };
        let c = self.consumers.get_mut(key).expect("just found");
        if c.sessions.is_empty() {
            return;
        }
        let (gen, max) = (c.gen, c.def.max_attempts);
        let holder = p as usize % c.sessions.len();
        let timeout = Duration::from_millis(c.def.ack_timeout_ms);
        let def = c.def.clone();
        let topic = def.topic.as_str();
        // A webhook (a sink, classic push URLs) gets a partition's events one at a time (its
        // order kept across failures: a redelivery waiting for its backoff holds the partition).
        let part_max = if def.pushed() { 1 } else { PART_INFLIGHT };
        let end = src.end(topic, p);
        let wall = src.wall_us();
        let mut skipped = 0;
        let Consumer { parts, sessions, filters, persist: keep, .. } = c;
        let Some(part) = parts.get_mut(p) else { return };
        let sess = &mut sessions[holder];
        part.stalled = false;
        let wanted = |f: &Frame, s: &Sess| matches_all(filters, f.body()) && matches_all(&s.filters, f.body());
        let (mut read, mut read_attempts, mut pick) = (Vec::new(), Vec::new(), Vec::new());
        let mut dead = Vec::new();
        let mut scanned = 0;
        let mut more = false;
        loop {
            let room_s = sess.window.saturating_sub(sess.inflight) as usize;
            let room = room_s.min(part_max.saturating_sub(part.inflight.len() + part.later.dead.len()));
            // At least one event may always be in flight, however large.
            let full_bytes = sess.inflight > 0 && sess.bytes >= window_bytes;
            if room == 0 || full_bytes {
                part.stalled = room_s == 0 || full_bytes;
                break;
            }
            let bytes_room = window_bytes.saturating_sub(sess.bytes).max(1);
            if let Some((&o, &Retry { attempt: made, due })) = part.later.retry.first_key_value() {
                let spent = u32::from(made) >= max;
                if (!spent && due > now) || end.is_none_or(|e| o >= e) {
                    // Newer events wait behind a redelivery (sticky order); so does one not
                    // readable yet (the Kafka backend's local copy refilling after a crash):
                    // what it is (a request?) and its dead letter need the event.
                    break;
                }
                let Some(mut got) = src.read(topic, p, o, 1, usize::MAX) else {
                    break; // unreadable for now: it stays first in line, tried again next tick
                };
                if let Some(later) = part.later.existing() {
                    later.retry.remove(&o);
                }
                match got.pop().filter(|f| f.header().offset == o) {
                    // A request is never redelivered nor dead-lettered (only a restart puts
                    // one here): settled.
                    Some(f) if request_deadline(&f).is_some() => {}
                    // Its attempts ran out while no session held it (a disconnect, a restart).
                    Some(_) if spent => {
                        part.later.make().dead.insert(o, made);
                        dead.push((o, made));
                    }
                    Some(f) => {
                        let attempt = made.saturating_add(1);
                        sess.take(part, o, attempt, &f, now + timeout);
                        read.push(f);
                        read_attempts.push(attempt);
                    }
                    None => {} // gone by retention, nothing left to redeliver
                }
                continue;
            }
            if end.is_some_and(|e| part.next >= e) {
                break;
            }
            let from_fresh =
                fresh.filter(|fr| fr.first().is_some_and(|f| f.header().offset == part.next) && read.is_empty());
            if let Some(fr) = from_fresh {
                let mut taken = 0;
                for (i, f) in fr.iter().enumerate() {
                    if taken == room || (sess.inflight > 0 && sess.bytes >= window_bytes) {
                        break;
                    }
                    let o = f.header().offset;
                    part.next = o + 1;
                    if expired(f, wall) {
                        skipped += 1;
                    } else if wanted(f, sess) {
                        sess.take(part, o, 1, f, now + timeout);
                        pick.push(i as u32);
                        taken += 1;
                    }
                }
                continue;
            }
            if !pick.is_empty() {
                break; // the fresh batch went out; anything after it is read next time
            }
            if scanned >= SCAN_BUDGET {
                more = true; // a selective filter over a long backlog: continue later
                break;
            }
            // Read ahead lazily: no more events, and no more bytes, than the session has room
            // for (a new consumer of large events does not pull hundreds into memory).
            let got = src.read(topic, p, part.next, room.min(READ_BATCH), bytes_room).unwrap_or_default();
            if got.is_empty() {
                break;
            }
            scanned += got.len();
            for f in got {
                if sess.inflight > 0 && sess.bytes >= window_bytes {
                    break; // read but not taken: read again when there is room
                }
                let o = f.header().offset;
                part.next = o + 1;
                if expired(&f, wall) {
                    skipped += 1;
                } else if wanted(&f, sess) {
                    sess.take(part, o, 1, &f, now + timeout);
                    read.push(f);
                    read_attempts.push(1);
                }
            }
        }
        let to = sess.at;
        self.expired += skipped;
        persist(&rc, topic, *keep, p, part, now_ms(), out);
        for (o, attempts) in dead {
            out.push(Effect::dead_letter(&rc, gen, p, o, attempts, ACK_TIMEOUT));
        }
        if !read.is_empty() {
            let subscription = key.subscription.clone();
            out.push(Effect::Deliver { to, subscription, frames: read.into(), pick: None, attempts: read_attempts });
        }
        if let (false, Some(fr)) = (pick.is_empty(), fresh) {
            let attempts = vec![1; pick.len()];
            let subscription = key.subscription.clone();
            out.push(Effect::Deliver { to, subscription, frames: fr.clone(), pick: Some(pick), attempts });
        }
        if more {
            out.push(Effect::Continue { key: rc, partition: p });
        }
    }
}
