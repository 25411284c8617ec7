//! Subscriptions: who receives what. Definitions (`definition`) are checked, normalized and kept
//! in RocksDB by the subscription's owner shard; filters (`filter`, with the CESQL engine in
//! `cesql`) are compiled once per subscription. Those two are pure and live in the
//! `evmesh-protocol` crate (so the fuzz targets build without the storage engine); they are
//! re-exported here so `crate::subscription::{cesql, filter}` paths keep working.

pub use evmesh_protocol::subscription::{cesql, filter};
pub mod definition;
