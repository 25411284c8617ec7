//! Acks and nacks (and releases, rejects, deferrals): what a session's answer settles, what
//! is due again after its backoff, what is dead-lettered; and the dead letter's own report.

use std::time::{Duration, Instant};

use super::consumers::Machine;
use super::effect::{now_ms, persist, Effect, NACK, REJECTED};
use super::source::Source;
use super::state::{Consumer, InFlight, Part, Retry};
use super::timers::Jitter;
use super::traced::{self, Settled};
use crate::model::delivery::{AckKind, ConsumerKey};

impl Machine {
    /// Acks, nacks or an up-to ack of partition `p`; `offsets` sorted. Returns `false` if the
    /// consumer has no state here (the shard then settles what is stored).
    #[allow(clippy::too_many_arguments)]
    pub fn ack(
        &mut self,
        key: &ConsumerKey,
        p: u32,
        offsets: &[u64],
        kind: AckKind,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) -> bool {
        let Some(rc) = self.rc(key) else { return false };
        let mut jitter = Jitter(&mut self.rng);
        let base = self.backoff_base;
        let c = self.consumers.get_mut(key).expect("just found");
        let (gen, max) = (c.gen, c.def.max_attempts);
        let Consumer { parts, sessions, persist: keep, def, .. } = c;
        let Some(part) = parts.get_mut(p) else { return true };
        let op = match kind {
            AckKind::Ack | AckKind::UpTo => "ack",
            AckKind::Release(_) => "release",
            AckKind::Reject => "reject",
            AckKind::Nack => "nack",
            AckKind::Defer(_) => "defer",
        };
        let mut settle = |o: u64, part: &mut Part| -> Option<InFlight> {
            let f = part.inflight.remove(o)?;
            if let Some(s) = sessions.iter_mut().find(|s| s.at == f.session) {
                s.release(&f);
            }
            traced::settled((&f.trace, f.attempt), def, p, o, Settled::By(op));
            Some(f)
        };
        match kind {
            AckKind::Ack => {
                for &o in offsets {
                    settle(o, part);
                    if let Some(later) = part.later.existing() {
                        later.retry.remove(&o);
                    }
                }
            }
            // Only what was delivered can be confirmed: an id past that is ignored.
            AckKind::UpTo if offsets.iter().any(|&o| o >= part.next) => {}
            AckKind::UpTo => {
                let upto = offsets.iter().copied().max().unwrap_or(0);
                let done: Vec<u64> = part.inflight.iter().map(|(o, _)| o).take_while(|&o| o <= upto).collect();
                for o in done {
                    settle(o, part);
                }
                if let Some(later) = part.later.existing() {
                    later.retry = later.retry.split_off(&upto.saturating_add(1));
                }
            }
            // Handed back unattempted (a webhook session holding its sink): due again after the
            // wait, its attempt not counted, so the next delivery carries the same number.
            AckKind::Release(ms) => {
                let due = now + Duration::from_millis(u64::from(ms));
                for &o in offsets {
                    let Some(f) = settle(o, part) else { continue };
                    if !f.rpc {
                        part.later.make().retry.insert(o, Retry { attempt: f.attempt.saturating_sub(1), due });
                    }
                }
            }
            // Refused for good (a classic subscriber's retCode 3): dead-lettered now.
            AckKind::Reject => {
                for &o in offsets {
                    let Some(f) = settle(o, part) else { continue };
                    if !f.rpc && part.failed(o, f.attempt, 0, now) {
                        out.push(Effect::dead_letter(&rc, gen, p, o, f.attempt, REJECTED));
                    }
                }
            }
            AckKind::Nack | AckKind::Defer(_) => {
                // A deferral (a webhook sink's `Retry-After`) is a failed attempt all the same,
                // tried again no sooner than it asked.
                let asked = match kind {
                    AckKind::Defer(ms) => Duration::from_millis(u64::from(ms)),
                    _ => Duration::ZERO,
                };
                for &o in offsets {
                    let Some(f) = settle(o, part) else { continue };
                    let due = now + jitter.backoff(base, f.attempt).max(asked);
                    if !f.rpc && part.failed(o, f.attempt, max, due) {
                        out.push(Effect::dead_letter(&rc, gen, p, o, f.attempt, NACK));
                    }
                }
            }
        }
        compact(part);
        persist(&rc, &def.topic, *keep, p, part, now_ms(), out);
        let mut unblocked = vec![p];
        unblocked.extend(parts.0.iter().filter(|(q, x)| *q != p && x.stalled).map(|(q, _)| *q));
        for q in unblocked {
            self.pump(key, q, None, now, src, out);
        }
        true
    }

    /// A dead letter was written (`ok`) or could not be (it is tried again after the longest
    /// backoff). Returns `false` if that consumer incarnation is gone (the shard then settles
    /// what is stored).
    #[allow(clippy::too_many_arguments)]
    pub fn dead_lettered(
        &mut self,
        key: &ConsumerKey,
        gen: u64,
        p: u32,
        o: u64,
        attempts: u16,
        ok: bool,
        now: Instant,
        src: &impl Source,
        out: &mut Vec<Effect>,
    ) -> bool {
        let due = now + Jitter(&mut self.rng).backoff(self.backoff_base, 5);
        let Some(rc) = self.rc(key) else { return false };
        let c = self.consumers.get_mut(key).expect("just found");
        if c.gen != gen {
            return false;
        }
        let Some(part) = c.parts.get_mut(p) else { return true };
        if let Some(later) = part.later.existing() {
            later.dead.remove(&o);
        }
        if !ok {
            part.later.make().retry.insert(o, Retry { attempt: attempts.saturating_sub(1), due });
        }
        persist(&rc, &c.def.topic, c.persist, p, part, now_ms(), out);
        self.pump(key, p, None, now, src, out);
        true
    }
}

/// Drops settled entries from the front of the deadline queue, and rebuilds it when settled
/// entries behind the front outnumber the live ones (out-of-order acks), so it stays bounded.
fn compact(part: &mut Part) {
    let inflight = &part.inflight;
    let Some(later) = part.later.existing() else { return };
    while let Some(&(_, o, a)) = later.deadlines.front() {
        if inflight.get(o).is_some_and(|f| f.attempt == a) {
            break;
        }
        later.deadlines.pop_front();
    }
    if later.deadlines.len() > 2 * inflight.len() + 64 {
        later.deadlines.retain(|&(_, o, a)| inflight.get(o).is_some_and(|f| f.attempt == a));
    }
}
