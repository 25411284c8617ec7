//! Adaptors turn one external protocol's request into EventMeshFrames, and frames back into that
//! protocol's wire format. Pure code: bytes in, frames out; no I/O, no shard state.
//!
//! Called by `ingress` on the shard that accepted the connection.

pub mod a2a;
pub mod cloudevents;
pub mod eventmesh_tcp;
mod flat;
pub mod kafka;
pub mod meshmessage;
mod rfc3339;
pub mod rocketmq;
pub mod tracecontext;
pub mod webhook;

pub(crate) use rfc3339::civil_from_days;

/// Frame -> wire for push delivery: how a protocol renders a stored event as an HTTP POST to a
/// subscriber's URL, and what the subscriber's 2xx answer means. Implemented by
/// `cloudevents::BinaryPush` (webhook sinks) and `meshmessage::PushForm` (classic subscribers);
/// the broker's webhook transport (`push::webhook`) does the rest (statuses, Retry-After,
/// backoff, dead letters) the same for every protocol.
pub trait PushWire {
    /// The request's headers and body for `frame`, delivered as `d` says.
    fn request(&self, frame: &frame_codec::Frame, d: &PushContext<'_>) -> (Vec<(String, String)>, Vec<u8>);
    /// What a 2xx answer's body says.
    fn verdict(&self, body: &[u8]) -> Verdict;
}

/// One push of an event: its delivery id and attempt, the request target (path and query, what
/// a signature covers), and the time (Unix seconds).
#[derive(Debug, Clone, Copy)]
pub struct PushContext<'a> {
    /// The id the subscriber acks with, `partition:offset:attempt`.
    pub delivery_id: &'a str,
    /// Which attempt this push is, 1 for the first.
    pub attempt: u16,
    /// The request target of the subscriber's URL: path and query.
    pub target: &'a str,
    /// The time of the push, seconds since the Unix epoch (a webhook push's `X-Em-Timestamp`).
    pub now_s: u64,
}

/// A subscriber's 2xx answer, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Done: acknowledged.
    Done,
    /// Try again (backoff, then the dead-letter topic).
    Retry,
    /// Refused for good: dead-lettered at once.
    Refused,
}

/// Percent-decodes `raw` (RFC 3986): `%` HEXDIG HEXDIG is the byte it names, any other `%` is
/// itself, and with `plus_is_space` (form bodies) `+` is a space. `from_str_radix` alone would
/// also take a sign in place of a digit (`%+5`): each digit is checked.
pub(crate) fn percent_decode(raw: &[u8], plus_is_space: bool) -> Vec<u8> {
    let hex = |b: Option<&u8>| b.and_then(|&b| char::from(b).to_digit(16)).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match (raw[i], hex(raw.get(i + 1)), hex(raw.get(i + 2))) {
            (b'%', Some(high), Some(low)) => {
                out.push(high * 16 + low);
                i += 3;
            }
            (b'+', ..) if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

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
