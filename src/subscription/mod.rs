//! Subscriptions: who receives what. So far the filters (`filter`, with the CESQL engine in
//! `cesql`); the registry and dispatch come with the delivery issue.

pub mod cesql;
pub mod filter;
