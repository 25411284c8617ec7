//! Sockets: binding the per-shard listeners, TLS, and driving one HTTP/1.1 connection.
//!
//! The connection loop owns the buffers and the socket; parsing is `http`'s pure code and the
//! meaning of a request is a [`Handler`]'s. A connection lives and dies on the shard that
//! accepted it. Plain and TLS connections are one [`Stream`] to everything above.

pub mod client;
pub mod conn;
pub mod deadline;
pub mod listen;
pub mod stream;
pub mod tls;
pub mod upgrade;
pub mod ws;

pub use conn::{serve, ConnGuard, Handler, Request};
pub use stream::Stream;
pub use upgrade::{A2aRelaySpec, A2aStreamSpec, FollowSpec, Response, SessionSpec, TurnSpec, Upgrade};
