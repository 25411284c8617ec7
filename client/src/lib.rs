//! The evmesh client: publish, subscribe and consume [CloudEvents](cloudevents::Event) on an
//! evmesh broker over HTTP/1.1 and WebSocket, with the hard parts done once: acks and credit,
//! reconnects with full-jitter backoff, asking `GET /session/recommend` where a subscription
//! lives (and again after a `1012` "home moved"), redirects (never from https to http), and
//! tokens refreshed before they expire.
//!
//! ```no_run
//! use cloudevents::{EventBuilder, EventBuilderV10};
//! use evmesh_client::{Client, Subscription, Start};
//! use futures_util::StreamExt;
//!
//! # async fn run() -> Result<(), evmesh_client::Error> {
//! let client = Client::new("http://127.0.0.1:8080")?;
//! client.subscribe(&Subscription::new("billing", "orders").start(Start::Earliest)).await?;
//! let event = EventBuilderV10::new().id("o-1").source("/shop").ty("com.shop.order")
//!     .data("application/json", serde_json::json!({"amount": 120}))
//!     .build().expect("a valid event");
//! let stored = client.publish("orders", &event).await?;
//! println!("stored at {}/{}", stored.partition, stored.offset);
//!
//! let mut consumer = client.consumer("billing").start();
//! while let Some(delivery) = consumer.next().await {
//!     let delivery = delivery?;
//!     println!("{}", delivery.event);
//!     delivery.ack();
//! }
//! # Ok(()) }
//! ```
//!
//! Runs on tokio; TLS is rustls (ring), with the public web roots unless told otherwise.

#![warn(missing_docs)]

mod backoff;
mod client;
mod consume;
mod error;
mod event;
mod publish;
mod request;
mod streaming;
mod subscription;
mod task;
mod token;

pub use backoff::Backoff;
pub use client::{Client, ClientBuilder};
pub use consume::{ConnectionState, Consumer, ConsumerBuilder, Delivery, Transport};
pub use error::{Error, Problem, Result};
pub use event::{from_json, to_binary, to_json, ContentMode};
pub use publish::{Published, Publisher, Receipt};
pub use streaming::{
    Agent, AgentEvent, Chunk, ChunkKind, ChunkStream, Session, SessionPublisher, SessionSubscriber, Streaming, Turn,
};
pub use subscription::{Filter, Mode, Start, Subscribed, Subscription};
pub use token::{Refresh, RefreshFuture, Token};

/// The `cloudevents-sdk` crate, whose `Event` this client sends and receives.
pub use cloudevents;

/// The README's example, compiled by `cargo test` (doctests) so that it works as written.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
