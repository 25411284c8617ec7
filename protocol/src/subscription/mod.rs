//! The pure half of subscriptions: the CESQL engine (`cesql`) and the Subscriptions API filter
//! dialects compiled from JSON and matched against archived frames (`filter`). Definitions,
//! storage and dispatch live in the broker (`evmesh::subscription`).

pub mod cesql;
pub mod filter;
