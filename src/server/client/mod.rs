//! The broker's own HTTP/1.1 client, for what evmesh calls out to (webhook sinks, remote
//! agents): on the shard that uses it, a pool of keep-alive connections per origin, every step
//! (connect, write, each read) under a deadline, every response bounded. The wire format is the
//! protocol crate's (`http::client`: a request writer and a strict response-head parser, the
//! request side's chunked scanner for chunked bodies).
//!
//! `http` and `https` (rustls, `tls::connect`: the Mozilla roots and `webhook_ca_file`). A
//! host name is resolved by the system resolver on a thread of its own ([`Url::resolve`]; it
//! blocks, and a shard must not), by the caller, which keeps the address.
//!
//! Its files: `url.rs` (what can be called), `resolve.rs` (names, off the shard), `pool.rs`
//! (the request path: the keep-alive pool, `send`, connecting), `stream.rs` (answers read as
//! they come), `read.rs` (reading an answer under the deadline), `sockets.rs` (the client's
//! share of the descriptors), `error.rs`.

mod error;
mod pool;
mod read;
mod resolve;
mod sockets;
mod stream;
mod url;

pub use error::ClientError;
pub use pool::{Answer, Pool};
pub use sockets::{set_socket_budget, sockets_open};
pub use stream::Streamed;
pub use url::Url;

#[cfg(test)]
mod tests;
