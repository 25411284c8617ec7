//! Cooperative scheduling helpers for the shards' monoio event loops.
//!
//! Its files: `yielding.rs` (giving the loop a turn: `yield_now`, `Slice`, `TURN`, the
//! heartbeat), `gate.rs` (one at a time, in order), `meter.rs` (the core time a task takes),
//! `lane.rs` (the heavy lane costly requests wait in), `load.rs` (how busy the loop has
//! been lately), `clock.rs` (the thread's clock: one reading per poll).

pub mod clock;
mod gate;
mod lane;
mod load;
mod meter;
mod yielding;

pub use gate::{Gate, Place};
pub use lane::{charge, handling, lane_busy, turn, Handling, HEAVY};
pub use load::has_time;
pub use meter::{metered, Meter};
pub use yielding::{beat, set_heartbeat, timers_ran, yield_now, Slice, SLICE, TURN};

#[cfg(test)]
pub(crate) mod tests;
