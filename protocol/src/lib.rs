//! evmesh's protocol code, sans-io: bytes in, values out. No sockets, no async, no runtime
//! types, no storage engine, and no application types (what a connection becomes after a
//! response is the caller's type parameter, [`http::Response`]'s `U`).
//!
//! Kept out of the `evmesh` crate so that its tests and the fuzz targets build without RocksDB
//! or librdkafka. The broker re-exports these modules (`evmesh::http`, `evmesh::ws`,
//! `evmesh::adaptor`, `evmesh::subscription::{cesql, filter}`) and owns the sockets, buffers and
//! shard state that drive them.

#![deny(missing_docs)]

pub mod adaptor;
pub mod http;
pub mod subscription;
pub mod ws;
