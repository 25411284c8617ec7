//! Configuration in two stages: [`RawConfig`] is what the operator wrote (commented TOML, then
//! `EVMESH_*` variables, then flags; later wins), [`Config`] is what the server runs with, checked
//! and with every derived value filled in. Only `Config` leaves this module's callers' `main`.
//!
//! One table, [`KEYS`], names every key once: it drives the environment, the flags and the help.
//!
//! Its files: `keys.rs` (the key table and the defaults), `raw.rs` (`RawConfig` and loading
//! it), `settings.rs` (`Config` and its types), `validate.rs` (raw -> `Config`), `error.rs`,
//! and `fds.rs` (the open-files budget).

pub mod fds;

mod error;
mod keys;
mod raw;
mod settings;
mod validate;

pub use error::ConfigError;
pub use keys::{DEFAULT_TOML, KEYS};
pub use raw::RawConfig;
pub use settings::{local_url, Config, IoDriver, OtlpProtocol, StorageKind, MAX_WINDOW};

#[cfg(test)]
mod tests;
