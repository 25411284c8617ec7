//! evmesh: a thread-per-core CloudEvents broker front. See ARCHITECTURE.md for the map.

pub mod adaptor;
pub mod admin;
pub mod cli;
pub mod config;
pub mod delivery;
pub mod http;
pub mod ingress;
pub mod push;
pub mod runtime;
pub mod server;
pub mod shard;
pub mod storage;
pub mod subscription;
pub mod sys;
pub mod task;
pub mod ws;
