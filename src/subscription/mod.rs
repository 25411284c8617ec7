//! Subscriptions: who receives what. Definitions (`definition`) are checked, normalized and kept
//! in RocksDB by the subscription's owner shard; filters (`filter`, with the CESQL engine in
//! `cesql`) are compiled once per subscription. Dispatch and delivery come next.

pub mod cesql;
pub mod definition;
pub mod filter;
