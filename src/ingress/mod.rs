//! The traffic listener: [`Traffic`], its handler on one shard (requests are served on the shard
//! that accepted the connection), and what the connection loop asks of it (`server::Handler`: a
//! caller per connection, each request through CORS and the route table, a connection upgraded
//! into its session). What a request goes through is in the files, one concern each:
//!
//! * `router.rs`: the one route table, method + path -> endpoint, and the order of refusals;
//! * `gate.rs`: authentication, then per request the ACL, the namespaces, the rate limits, the
//!   quotas and the backlog (`Gate`), and the memory shed;
//! * `homes.rs`: with Kafka, which instance serves a subscription, an agent or a lite topic,
//!   and the 307 there;
//! * `adaptor.rs` and `pipeline.rs`: the one ingress path (the FrameAdaptor SPI, then the
//!   transformer and the routes), `store.rs`: parse and store;
//! * the endpoints: `store.rs` (`/events/publish`), `request.rs`, `subscribe.rs`, `attach.rs`
//!   (`/events/ws`, `/events/sse`), `poll.rs` (`/events/poll`, `/events/ack`), `ws_publish.rs`,
//!   `session.rs`, `call.rs`, `agent.rs`, `recommend.rs`, `meshmessage.rs` (classic EventMesh
//!   HTTP), `a2a.rs`;
//! * `responses.rs` and `cors.rs`: answers many of them share, and CORS.

mod a2a;
mod adaptor;
mod agent;
mod attach;
mod call;
mod cors;
pub mod eventmesh_tcp;
mod gate;
mod homes;
mod meshmessage;
mod pipeline;
mod poll;
mod recommend;
mod request;
mod responses;
mod router;
mod session;
mod store;
mod subscribe;
mod traced;
mod ws_publish;

use std::cell::RefCell;
use std::rc::Rc;

use self::cors::{cors_origin, preflight};
pub use self::responses::storage_problem;
use crate::governance::identity::Principal;
use crate::governance::{Caller, Failures, View};
use crate::http::{Method, StatusCode};
use crate::server::conn::{ConnGuard, ConnLimits, Peer};
use crate::server::{Handler, Request, Response, Upgrade};
use crate::shard::core::Shard;

/// The traffic listener's handler on one shard.
pub struct Traffic {
    pub shard: Rc<Shard>,
    /// This shard's copy of the governance snapshot.
    view: View,
    /// Failed authentications per source address (throttled past a few).
    failures: RefCell<Failures>,
    /// Itself, for the sessions it hands a connection to: they share the shard's handler
    /// (one snapshot copy per shard, not one per session).
    me: std::rc::Weak<Traffic>,
}

impl Traffic {
    pub fn new(shard: Rc<Shard>) -> Rc<Traffic> {
        let view = View::new(&shard.shared.governance);
        Rc::new_cyclic(|me| Traffic { shard, view, failures: RefCell::new(Failures::default()), me: me.clone() })
    }

    /// This handler, shared.
    fn shared(&self) -> Rc<Traffic> {
        self.me.upgrade().expect("a handler is used through its Rc")
    }
}

impl Handler for Traffic {
    type Conn = Caller;

    fn connect(&self, peer: Peer) -> Caller {
        Caller::new(
            peer.addr.map(|p| p.ip()),
            peer.cert.and_then(|c| Some(Principal::certified(c.principal?, c.expires_us))),
        )
    }
    fn upgraded(
        &self,
        caller: Caller,
        upgrade: Upgrade,
        stream: crate::server::Stream,
        buf: Vec<u8>,
        limits: ConnLimits,
        guard: ConnGuard,
    ) {
        let shard = self.shard.clone();
        if let Upgrade::WsPublish(spec) = upgrade {
            // The publisher's requests go through the caller's limits: the session owns it.
            let session = self.publish_session(caller, stream, buf, limits, spec);
            monoio::spawn(async move {
                Box::pin(session).await;
                drop(guard);
            });
            return;
        }
        // The caller (its tenant's connection slot) is held as long as the session, like the
        // connection's own count: by a WebSocket session's publisher (its `publish` messages go
        // through the caller's limits), by the guard otherwise.
        let mut caller = Some(caller);
        let mut publisher =
            |principal: &Option<String>, tenant: &Option<String>, expires_us, credential: &Option<_>| {
                let credential = Option::clone(credential);
                self.session_publisher(&mut caller, principal, tenant, (expires_us, credential))
            };
        let session: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = match upgrade {
            Upgrade::WsEcho => Box::pin(crate::server::ws::echo(stream, buf, limits)),
            Upgrade::WsDeliver(spec) => {
                let p = publisher(&spec.principal, &spec.tenant, spec.expires_us, &spec.credential);
                Box::pin(crate::push::ws::session(shard, stream, buf, limits, spec, p))
            }
            Upgrade::Sse(spec) => Box::pin(crate::push::sse::session(shard, stream, buf, spec)),
            Upgrade::FollowWs(spec) => {
                let p = publisher(&spec.principal, &spec.tenant, spec.expires_us, &spec.credential);
                Box::pin(crate::push::follow::websocket(shard, stream, buf, limits, spec, p))
            }
            Upgrade::FollowSse(spec) => Box::pin(crate::push::follow::sse(shard, stream, buf, spec)),
            Upgrade::TurnSse(spec) => Box::pin(crate::push::turn::sse(shard, stream, buf, spec)),
            Upgrade::A2aSse(spec) => Box::pin(crate::push::a2a::sse(shard, stream, buf, spec)),
            Upgrade::A2aRelay(spec) => Box::pin(crate::push::a2a::relay(shard, stream, buf, spec)),
            Upgrade::WsPublish(_) => unreachable!("served above"),
        };
        // Boxed: a delivery session's publisher took the caller, and the room of one is not
        // kept in every session's task for nothing.
        let guard = (guard, caller.map(Box::new));
        monoio::spawn(async move {
            session.await;
            drop(guard);
        });
    }

    fn refused(&self, status: StatusCode) {
        self.shard.shared.metrics.shard(self.shard.id).refused(status.0);
    }

    fn heavy(&self, cost: std::time::Duration) {
        self.shard.shared.metrics.shard(self.shard.id).heavy(cost);
    }

    async fn handle(&self, caller: &mut Caller, req: Request<'_>) -> Response {
        // CORS: a page of an allowed origin may read the answers (and is told so before it
        // sends, on a preflight); every other caller gets exactly what it got before.
        let allowed = cors_origin(&self.shard.shared.config.cors_allowed_origins, req.header("origin"));
        let Some(origin) = allowed else { return self.route(caller, req).await };
        if req.method() == Method::Options && req.header("access-control-request-method").is_some() {
            return preflight(origin, req.header("access-control-request-headers"));
        }
        self.route(caller, req)
            .await
            .with_header("access-control-allow-origin", &origin)
            .with_header("vary", "origin")
            .with_header("access-control-expose-headers", "retry-after, www-authenticate, location, content-type")
    }
}
