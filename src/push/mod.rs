//! Delivery to the sessions a shard accepted: WebSocket (`ws`), server-sent events (`sse`) and
//! long-poll (`poll`) sessions of acknowledged delivery, each fed by the partition owners
//! (`crate::delivery`), and live fan-out to WebSocket sessions that attached with `?ack=none`
//! (at-most-once, from the moment they attach).
//!
//! The queues they drain and the renderings in them are the shard's session registry
//! (`crate::shard::sessions`); this module attaches and detaches acknowledged sessions, and its
//! submodules own the sockets.

pub mod poll;
pub mod sse;
pub mod ws;

use std::rc::Rc;

use futures::channel::mpsc;

use crate::server::SessionSpec;
use crate::shard::core::Shard;
use crate::shard::message::{ConsumerKey, SessionChange, SessionEvent, SessionRef};
pub use crate::shard::sessions::{Kind, Outbound, Sessions};
use crate::shard::ShardId;

/// The offsets owner of a session: the subscription, or one client of it (a session without a
/// `clientId` is a client of its own whose offsets are never stored). Returns the key and
/// whether its offsets are stored.
pub fn consumer_of(spec: &SessionSpec, shard: ShardId, session: u64) -> (ConsumerKey, bool) {
    let subscription = spec.subscription.clone();
    match (&spec.client, spec.per_client) {
        (_, false) => (ConsumerKey { subscription, client: String::new() }, true),
        (Some(c), true) => (ConsumerKey { subscription, client: c.clone() }, true),
        (None, true) => (ConsumerKey { subscription, client: format!("~{}.{session}", shard.0) }, false),
    }
}

/// Registers an acknowledged session of `kind` on this shard and announces it to every shard.
/// Returns its queue, its consumer and its reference.
pub fn attach_acked(
    shard: &Rc<Shard>,
    spec: &SessionSpec,
    kind: Kind,
) -> (mpsc::Receiver<Outbound>, ConsumerKey, SessionRef) {
    let (id, events) = shard.sessions.add_acked(&spec.subscription, kind, shard.shared.config.shards);
    let (consumer, persist) = consumer_of(spec, shard.id, id);
    let at = SessionRef { shard: shard.id, id };
    let window = shard.shared.config.session_window;
    let change = SessionChange::Attach { window, filters: spec.filters.clone(), persist };
    shard.announce_session(SessionEvent { consumer: consumer.clone(), topic: spec.topic.clone(), session: at, change });
    (events, consumer, at)
}

/// Unregisters an acknowledged session and tells every shard it is gone (its unacknowledged
/// events go to the consumer's other sessions).
pub fn detach_acked(shard: &Rc<Shard>, consumer: ConsumerKey, topic: &str, at: SessionRef) {
    shard.sessions.remove_acked(at.id);
    let change = SessionChange::Detach;
    shard.announce_session(SessionEvent { consumer, topic: topic.to_owned(), session: at, change });
}
