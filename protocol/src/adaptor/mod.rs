//! Adaptors turn one external protocol's request into EventMeshFrames, and frames back into that
//! protocol's wire format. Pure code: bytes in, frames out; no I/O, no shard state.
//!
//! Called by `ingress` on the shard that accepted the connection.

pub mod cloudevents;
pub mod kafka;
pub mod meshmessage;
mod rfc3339;
pub mod webhook;

pub(crate) use rfc3339::civil_from_days;

/// Whether `s` is an RFC 3339 timestamp (as CloudEvents `time` must be).
pub fn is_rfc3339(s: &str) -> bool {
    rfc3339::is_valid(s)
}

/// Microseconds since the epoch of an RFC 3339 timestamp.
pub fn rfc3339_micros(s: &str) -> Option<i64> {
    rfc3339::to_micros(s)
}

/// The RFC 3339 (UTC, microseconds) form of a time in microseconds since the epoch.
pub fn rfc3339_from_micros(micros: i64) -> String {
    rfc3339::from_micros(micros)
}
