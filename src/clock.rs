//! Wall-clock readings, for timestamps stored or shown (never for timeouts: those use
//! `Instant`).

/// Microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}
