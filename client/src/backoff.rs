//! Reconnect delays: exponential with full jitter, as Centrifugo's clients do
//! (`min + random(0, min(max, min * 2^step))`, capped at `max`), so a broker restart is not
//! met by every client at the same instant.

use std::time::Duration;

/// The delays between reconnect attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay and the least (default 0.5 s).
    pub min: Duration,
    /// The greatest delay (default 20 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { min: Duration::from_millis(500), max: Duration::from_secs(20) }
    }
}

impl Backoff {
    /// The delay before attempt `step` (0 for the first retry).
    pub fn delay(&self, step: u32) -> Duration {
        // A zero minimum would make every retry immediate: a loop that spins.
        let min = (self.min.as_millis() as u64).max(10);
        let max = (self.max.as_millis() as u64).max(min);
        let ceiling = min.saturating_mul(1u64 << step.min(31)).min(max);
        let jitter = fastrand::u64(0..=ceiling);
        Duration::from_millis(min.saturating_add(jitter).min(max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_between_min_and_max_and_spread() {
        let b = Backoff::default();
        for step in 0..40 {
            for _ in 0..200 {
                let d = b.delay(step);
                assert!(d >= b.min && d <= b.max, "{step}: {d:?}");
            }
        }
        // Full jitter: late steps spread over the whole range, not one value.
        let late: std::collections::BTreeSet<_> = (0..200).map(|_| b.delay(10).as_millis() / 1000).collect();
        assert!(late.len() > 5, "{late:?}");
        assert!((0..200).all(|_| b.delay(0) <= Duration::from_millis(1000)));
    }

    #[test]
    fn a_zero_minimum_never_makes_a_loop_spin() {
        let b = Backoff { min: Duration::ZERO, max: Duration::ZERO };
        assert!((0..100).all(|s| b.delay(s) >= Duration::from_millis(10)));
    }
}
