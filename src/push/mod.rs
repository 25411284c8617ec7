//! Delivery to the sessions a shard accepted: WebSocket (`ws`), server-sent events (`sse`) and
//! long-poll (`poll`) sessions of acknowledged delivery, each fed by the partition owners
//! (`crate::delivery`), and live fan-out to WebSocket sessions that attached with `?ack=none`
//! (at-most-once, from the moment they attach).
//!
//! The queues they drain and the renderings in them are the shard's session registry
//! (`crate::shard::sessions`); this module attaches and detaches acknowledged sessions, and its
//! submodules own the sockets.

pub mod a2a;
pub mod follow;
mod lean;
pub mod poll;
pub mod sse;
pub mod turn;
pub mod webhook;
pub mod ws;
mod wsmsg;

pub(crate) use wsmsg::pay_heavy;

use std::rc::Rc;

use crate::queue;

use crate::delivery::anonymous_client;
use crate::model::delivery::{ConsumerKey, SessionRef};
use crate::model::ShardId;
use crate::server::SessionSpec;
use crate::shard::core::Shard;
use crate::shard::message::{SessionChange, SessionEvent};
pub use crate::shard::sessions::{Kind, Outbound, Sessions};

/// A session client's `{"type":"publish","topic":T,"event":{...}}` message (SPEC, "Other
/// protocols": on any WebSocket session): the ingress pipeline, as the session's caller. Handed
/// down at the upgrade, because push sits below ingress.
pub trait Publish {
    /// Publishes one such message (its whole text), appending its answer frame to `out`.
    fn publish<'a>(
        &'a mut self,
        text: &'a str,
        out: &'a mut Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
}

/// A session's publisher (see [`Publish`]).
pub type Publisher = Box<dyn Publish>;

/// The offsets owner of a session: the subscription, or one client of it (a session without a
/// `clientId` is a client of its own whose offsets are never stored). Returns the key and
/// whether its offsets are stored.
pub fn consumer_of(spec: &SessionSpec, shard: ShardId, session: u64) -> (ConsumerKey, bool) {
    let subscription = spec.subscription.clone();
    match (&spec.client, spec.per_client) {
        (_, false) => (ConsumerKey { subscription, client: String::new() }, true),
        (Some(c), true) => (ConsumerKey { subscription, client: c.clone() }, true),
        (None, true) => (ConsumerKey { subscription, client: anonymous_client(u32::from(shard.0), session) }, false),
    }
}

/// Whether a session's delivery ids name it (`delivery::owned_delivery_id`): an SSE stream of
/// an anonymous client, acked by requests that have only its ids to say whose they are. Its
/// events are queued as two frames each (its own head, the shared tail).
pub fn owns_its_ids(spec: &SessionSpec, kind: Kind) -> bool {
    kind == Kind::Sse && spec.per_client && spec.client.is_none()
}

/// Registers an acknowledged session of `kind` on this shard and announces it to every shard.
/// Returns its queue, its consumer and its reference.
pub fn attach_acked(
    shard: &Rc<Shard>,
    spec: &SessionSpec,
    kind: Kind,
) -> (queue::Receiver<Outbound>, ConsumerKey, SessionRef) {
    let owned = owns_its_ids(spec, kind);
    let (id, events) = shard.sessions.add_acked(&spec.subscription, kind, owned, shard.shared.config.shards);
    let (consumer, persist) = consumer_of(spec, shard.id, id);
    let at = SessionRef { shard: shard.id, id };
    let window = spec.window.unwrap_or(shard.shared.config.session_window);
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

/// How often each shard looks at the policy generation for its sessions.
const POLICY_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// The shard's one ticker for [`authority`]: wakes the sessions waiting on a policy change.
pub async fn watch_policy(shard: Rc<Shard>) {
    shard.policy.observe(shard.shared.governance.generation());
    loop {
        monoio::time::sleep(POLICY_TICK).await;
        shard.policy.observe(shard.shared.governance.generation());
    }
}

/// Returns, with the reason, once the session must end: its credential expired, or (within
/// `POLICY_TICK` of a change of the keys or the ACL) it no longer verifies or the ACL no
/// longer allows SUBSCRIBE on its subscription. Never returns for a session opened without a
/// principal (`auth = none`). A session costs one timer (its expiry) at most, not one a tick.
pub async fn authority(shard: &Shard, spec: &SessionSpec) -> &'static str {
    use crate::governance::acl::{Action, Kind};
    use futures::future::{select, Either};
    let Some(principal) = spec.principal.as_deref() else { return std::future::pending().await };
    // The ACL speaks of the names the principal uses, inside its tenant.
    let name = match &spec.tenant {
        Some(t) => {
            spec.subscription.strip_prefix(t.as_str()).and_then(|n| n.strip_prefix('.')).unwrap_or(&spec.subscription)
        }
        None => &spec.subscription,
    };
    let g = &shard.shared.governance;
    loop {
        let seen = shard.policy.seen();
        let changed = std::pin::pin!(shard.policy.after(seen));
        match spec.expires_us.map(|e| (e - crate::model::clock::now_micros()).max(0) as u64) {
            Some(0) => return "token expired",
            Some(us) => {
                let expiry = std::pin::pin!(monoio::time::sleep(std::time::Duration::from_micros(us)));
                if let Either::Left(_) = select(expiry, changed).await {
                    continue; // expired: said at the top
                }
            }
            None => changed.await,
        }
        let snap = g.snapshot();
        let now = crate::model::clock::now_micros();
        if spec.credential.as_ref().is_some_and(|c| snap.keys.verify(&c.0, now).is_err()) {
            return "token revoked";
        }
        if !snap.acl.decide(principal, Kind::Subscription, name, Action::Subscribe).0 {
            return "access revoked";
        }
    }
}

/// Runs `server` on a monoio runtime (epoll, timers on) with the accepted end of a loopback
/// connection, while `client` drives the other end on its own thread; returns what `client`
/// returned. For the transports' unit tests.
#[cfg(test)]
pub(crate) fn with_loopback_client<T, F>(
    client: impl FnOnce(std::net::TcpStream) -> T + Send + 'static,
    server: impl FnOnce(monoio::net::TcpStream) -> F,
) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = ()>,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || client(std::net::TcpStream::connect(addr).unwrap()));
    let (stream, _) = listener.accept().unwrap();
    stream.set_nonblocking(true).unwrap();
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(async move { server(monoio::net::TcpStream::from_std(stream).unwrap()).await });
    client.join().unwrap()
}

/// Resolves with the reason once a credential expiring at `expires_us` has expired (never
/// without one). (A follower's access is checked when it subscribes; a revoked ACL rule does
/// not end it before its credential does.)
pub(super) async fn expired(expires_us: Option<i64>) -> &'static str {
    let Some(at) = expires_us else { return std::future::pending().await };
    let left = (at - crate::model::clock::now_micros()).max(0) as u64;
    monoio::time::sleep(std::time::Duration::from_micros(left)).await;
    "token expired"
}
