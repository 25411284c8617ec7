//! The clock's input: ack deadlines passing (the delivery failed) and redeliveries falling
//! due; and the backoff between attempts, with its jitter ([`Jitter`]).

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::consumers::Machine;
use super::effect::{Effect, ACK_TIMEOUT};
use super::source::Source;
use super::state::Consumer;
use crate::model::delivery::ConsumerKey;

impl Machine {
    /// Expires unacknowledged deliveries past their deadline and sends due redeliveries.
    pub fn tick(&mut self, now: Instant, src: &impl Source, out: &mut Vec<Effect>) {
        let mut work: Vec<(Rc<ConsumerKey>, u32)> = Vec::new();
        let base = self.backoff_base;
        let mut jitter = Jitter(&mut self.rng);
        for (key, c) in self.consumers.iter_mut() {
            let max = c.def.max_attempts;
            let Consumer { parts, sessions, gen, def, .. } = c;
            for (p, part) in parts.0.iter_mut() {
                let mut expired = false;
                while let Some(&(deadline, o, attempt)) = part.later.deadlines.front() {
                    let live = part.inflight.get(o).is_some_and(|f| f.attempt == attempt);
                    if live && deadline > now {
                        break;
                    }
                    if let Some(later) = part.later.existing() {
                        later.deadlines.pop_front();
                    }
                    if !live {
                        continue;
                    }
                    let f = part.inflight.remove(o).expect("live");
                    if let Some(s) = sessions.iter_mut().find(|s| s.at == f.session) {
                        s.release(&f);
                    }
                    super::traced::settled((&f.trace, f.attempt), def, *p, o, super::traced::Settled::TimedOut);
                    expired = true;
                    if !f.rpc && part.failed(o, attempt, max, now + jitter.backoff(base, attempt)) {
                        out.push(Effect::dead_letter(key, *gen, *p, o, attempt, ACK_TIMEOUT));
                    }
                }
                part.give_back();
                let due = part.later.retry.first_key_value().is_some_and(|(_, r)| r.due <= now);
                if expired || due {
                    work.push((key.clone(), *p));
                }
            }
        }
        for (key, p) in work {
            self.pump(&key, p, None, now, src, out);
        }
    }
}

/// The jitter source: xorshift64* (jitter needs no cryptography, only spread).
pub(super) struct Jitter<'a>(pub(super) &'a mut u64);

impl Jitter<'_> {
    /// Redelivery backoff after `attempt` attempts: base * 2^(attempt-1), at most 16x, + <= 20%.
    pub(super) fn backoff(&mut self, base: Duration, attempt: u16) -> Duration {
        let d = base * (1u32 << u32::from(attempt.clamp(1, 5) - 1));
        let mut x = *self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *self.0 = x;
        let jitter = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        d + d.mul_f64(0.2 * jitter)
    }
}
