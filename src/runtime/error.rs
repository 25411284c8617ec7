//! Why the broker could not start.

use std::io;

use crate::storage::StorageError;

/// Why `runtime::start` failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("auth: {0}")]
    Auth(String),
    #[error("tls: {0}")]
    Tls(String),
    #[error("tier.s3: {0}")]
    Tier(String),
}
