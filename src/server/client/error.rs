//! Why a call failed: [`ClientError`], what callers see, and `Failed`, how one exchange on one
//! connection ended (a stale pooled connection is retried once on a new one).

use std::time::Duration;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the connection closed before the answer was complete")]
    Closed,
    #[error("the answer broke HTTP: {0}")]
    Protocol(&'static str),
    #[error("the answer's body is over {0} bytes")]
    TooLarge(usize),
}

/// How one exchange on one connection ended badly.
pub(super) enum Failed {
    /// Nothing came back on a pooled connection (the server had closed it): try a new one.
    Stale,
    Error(ClientError),
}
