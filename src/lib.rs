//! evmesh: a thread-per-core CloudEvents broker front. See ARCHITECTURE.md for the map.
//!
//! The sans-io protocol code (HTTP, WebSocket, the CloudEvents and Kafka adaptors, CESQL and
//! filters) is the `evmesh-protocol` crate, re-exported here under its old paths.

pub use evmesh_protocol::{adaptor, http, ws};

pub mod admin;

pub mod cluster;
pub mod config;
pub mod delivery;
pub mod governance;
pub mod ingress;
pub mod log;
pub mod metrics;
pub mod model;
pub mod push;
pub mod queue;
pub mod runtime;
pub mod server;
pub mod shard;
pub mod storage;
pub mod subscription;
pub mod sys;
pub mod task;
pub mod trace;
