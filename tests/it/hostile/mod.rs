//! The hostile suite: one unauthenticated client at a time tries to hurt the broker, and each
//! case asserts the bound that holds (bytes buffered, memory, attempts, a bystander's latency),
//! not only that the broker survived. One module per attack category.
mod cesql;
mod crash;
mod delivery;
mod fairness;
mod http;
mod limits;
mod memory;
