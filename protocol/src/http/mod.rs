//! HTTP/1.1, sans-io: a request-head parser, a resumable chunked-body scanner and a response
//! writer, and for the broker's own outbound requests a request writer and response-head parser
//! (`client`).
//!
//! Pure functions over byte slices: no sockets, no async, no runtime types. Incomplete input is
//! `Status::Partial` and consumes nothing; the connection code (in `server`) owns the buffers and
//! calls these again when more bytes arrive (the chunked scanner remembers how far it got, so it
//! never rescans). Errors carry the HTTP status they map to. It knows no application
//! types: what a connection becomes after a response is the caller's type parameter.

mod chunked;
pub mod client;
pub mod date;
mod parse;
mod response;

pub use chunked::{ChunkedEnd, ChunkedLimits, ChunkedScanner};
pub use parse::{parse_head, parse_head_into, BodyKind, Head, HeaderPos, Limits, Method};
pub use response::{itoa_buf::Buf as Decimal, problem, Response, StatusCode};

/// Outcome of parsing a prefix of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status<T> {
    /// Parsed a whole item from the first `n` bytes.
    Complete(T),
    /// Not enough bytes yet; nothing was consumed.
    Partial,
}

/// A request the server must refuse, with the status to refuse it with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {detail}")]
pub struct HttpError {
    /// The status to answer with: a 4xx for a malformed or over-limit request, a 5xx for one
    /// the server does not implement.
    pub status: StatusCode,
    /// A short, fixed explanation (`"missing Host header"`): the problem body's `detail`.
    pub detail: &'static str,
}

impl HttpError {
    pub(crate) const fn new(status: StatusCode, detail: &'static str) -> Self {
        HttpError { status, detail }
    }
    pub(crate) const fn bad(detail: &'static str) -> Self {
        HttpError::new(StatusCode::BAD_REQUEST, detail)
    }
}

#[cfg(test)]
mod tests;
